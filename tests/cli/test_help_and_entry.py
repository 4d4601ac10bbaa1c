"""``relax train --help`` documents every flag; the real entry point exits 2 without importing ray."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import attrs
import pytest

from relax.algorithms import algorithm_names
from relax.config.algorithm import AlgorithmConfig
from relax.cli.main import build_parser
from relax.config.run import RunConfig


def test_help_lists_every_estimator_and_documents_every_flag(cli):
    code, out, _ = cli("train", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for name in algorithm_names():
        assert name in flat
    assert "gdpo" in flat
    _, subparsers = build_parser()
    for action in subparsers["train"]._actions:
        assert action.help, f"{action.option_strings} has no help text"
        assert action.option_strings[0] in out


def test_every_configuration_field_has_a_flag():
    _, subparsers = build_parser()
    dests = {a.dest for a in subparsers["train"]._actions}
    fields = set(attrs.fields_dict(AlgorithmConfig)) | set(attrs.fields_dict(RunConfig)) - {"algorithm"}
    assert fields - dests == set()


def test_upstream_flag_names_and_defaults(cli):
    code, out, _ = cli("train", "--dry-run")
    import yaml

    config = yaml.safe_load(out)
    expected = {
        "eps_clip": 0.2,
        "kl_coef": 0.0,
        "kl_loss_type": "k1",
        "gamma": 1.0,
        "lam": 1.0,
        "n_samples_per_prompt": 8,
        "rollout_batch_size": 32,
        "eps_clip_high": 0.2,
        "advantage_estimator": "grpo",
        "normalize_advantages": False,
    }
    assert {k: config[k] for k in expected} == expected
    # SAPO's own hyper-parameters are in its configuration (fields of SAPO.Config), not in GRPO's
    assert "sapo_tau_pos" not in config
    sapo = yaml.safe_load(cli("train", "--dry-run", "--advantage-estimator", "sapo")[1])
    assert (sapo["sapo_tau_pos"], sapo["sapo_tau_neg"]) == (1.0, 1.05)


SCRIPT = textwrap.dedent(
    """
    import json, runpy, sys
    sys.argv = ["relax"] + json.loads(sys.argv[1])
    try:
        runpy.run_module("relax", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code
    heavy = sorted(m for m in ("ray", "megatron", "transfer_queue") if m in sys.modules)
    print(json.dumps({"code": code, "heavy": heavy}))
    """
)


@pytest.mark.timeout(120)
def test_python_m_relax_rejects_before_importing_ray(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    argv = [
        "train",
        "--advantage-estimator",
        "gdpo",
        "--reward-keys",
        "correctness",
        "--prompt-data",
        str(data),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "heavy": []}, proc.stderr
    assert "GDPO (--advantage-estimator gdpo) needs at least two reward keys" in proc.stderr
    assert "pass e.g. --reward-keys correctness format" in proc.stderr
