"""``--max-tokens-per-micro-batch`` on the command line: accepted with the torch backend, refused before
anything starts where it cannot work (the Megatron backend, a non-positive budget)."""

from __future__ import annotations

import yaml

import relax.backends.megatron.rules as megatron_pkg


def test_the_flag_reaches_the_config(cli):
    code, out, err = cli("train", "--dry-run", "--max-tokens-per-micro-batch", 256)
    assert code == 0, err
    assert yaml.safe_load(out)["max_tokens_per_micro_batch"] == 256


def test_megatron_and_bad_budgets_are_refused(cli, monkeypatch):
    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: True)
    code, _, err = cli("train", "--dry-run", "--backend", "megatron", "--max-tokens-per-micro-batch", 256)
    assert code == 2 and "--max-tokens-per-micro-batch is implemented for --backend torch only" in err
    code, _, err = cli("train", "--dry-run", "--max-tokens-per-micro-batch", 0)
    assert code == 2 and "--max-tokens-per-micro-batch" in err
