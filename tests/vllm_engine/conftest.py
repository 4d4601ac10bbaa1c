"""The vLLM engine tests (marker ``vllm``; the tox environment ``py311-vllm`` runs them).

Every test here is marked ``vllm`` and needs the ``vllm`` extra; where vLLM is not installed the
directory is skipped. One in-process ``vllm.LLM`` over a tiny random Qwen2 checkpoint is shared by
the engine tests of the session (building one costs ~10 s, the first one in a fresh environment
over a minute).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relax.rollout.vllm.environment import prepare_process
from relax.rollout.vllm.factory import vllm_installed

if not vllm_installed():
    pytest.skip("vLLM is not installed (the vllm extra: pip install -e '.[vllm]' torch==2.13.0)",
                allow_module_level=True)
prepare_process()  # before transformers or vLLM is imported: in-process engine, media packages checked

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
from tiny_checkpoints import build_checkpoint


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory) -> Path:
    """A random Qwen2 (~0.3M parameters) with the tests' word-level tokenizer, via ``save_pretrained``."""
    return build_checkpoint(tmp_path_factory.mktemp("vllm_ckpt") / "qwen2", "qwen2", seed=3)


@pytest.fixture(scope="session")
def engine(qwen2_checkpoint):
    from relax.models.hf.loading import load_hf_tokenizer
    from relax.rollout.vllm.engine import VLLMEngine
    from relax.rollout.vllm.factory import build_llm
    from relax.rollout.vllm.lora import checkpoint_weights_reader

    llm = build_llm(str(qwen2_checkpoint), seed=0, with_tokenizer=True)
    return VLLMEngine(llm, load_hf_tokenizer(qwen2_checkpoint), base_weights=checkpoint_weights_reader(qwen2_checkpoint))
