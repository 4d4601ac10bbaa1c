"""The README's example class runs and computes what it says (a median baseline per group)."""

import re
from pathlib import Path

import torch

from relax.algorithms import AlgorithmConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_class_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    algo = namespace["MedianBaselineGRPO"](AlgorithmConfig(n_samples_per_prompt=3))
    rewards = torch.tensor([1.0, 5.0, 2.0, 0.0, 9.0, 4.0])
    groups = torch.tensor([7, 7, 7, 3, 3, 3])
    out = algo.normalize_rewards(rewards, groups)
    # group 7: median 2 -> [-1, 3, 0]; group 3: median 4 -> [-4, 5, 0]
    assert torch.equal(out, torch.tensor([-1.0, 3.0, 0.0, -4.0, 5.0, 0.0]))
    assert out.dtype == torch.float32
