"""The rollout engine registry (``relax.rollout.registry``): a new engine is one package and one
registry entry. Here the package is a module written to a temporary directory, the entry is added to
``ENGINES`` for the test, and ``relax train --in-process`` runs with it: nothing in relax is edited."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from relax.cli.main import main
from relax.config.run import RunConfig
from relax.rollout import registry
from relax.rollout.engines import config_errors, engine_name, in_process_refusal

MODULE = "relax_test_recording_engine"

# A user's engine: the built-in model's engine, wrapped so that the test sees it was built and sampled
# with; it declares that it reports its own log-probs (as vLLM does), so the trainer measures them.
SOURCE = textwrap.dedent(
    '''
    from relax.rollout.tiny.entry import TinyEntry

    BUILT = []


    class RecordingEngine:
        def __init__(self, inner):
            self.inner, self.generate_calls = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def generate(self, prompt_ids, params, generator=None):
            self.generate_calls += 1
            return self.inner.generate(prompt_ids, params, generator)


    class RecordingEntry(TinyEntry):
        reports_behaviour_log_probs = True

        @classmethod
        def build(cls, config):
            BUILT.append(RecordingEngine(TinyEntry.build(config)))
            return BUILT[-1]
    '''
)


@pytest.fixture
def recording_engine(tmp_path, monkeypatch):
    """The module of the new engine, importable, and its one registry line."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.ENGINES, "recording", f"{MODULE}:RecordingEntry")
    yield
    sys.modules.pop(MODULE, None)


def test_the_built_in_engines_answer_from_their_entries():
    assert registry.engine_names() == ("tiny", "hf", "vllm")
    assert engine_name(RunConfig()) == "tiny" and engine_name(RunConfig(hf_checkpoint="/m")) == "hf"
    vllm = registry.engine_entry("vllm")
    assert vllm.reports_behaviour_log_probs and not vllm.runs_in_process and vllm.needs_hf_checkpoint
    assert not registry.engine_entry("tiny").needs_hf_checkpoint
    with pytest.raises(ValueError, match="'sglang': unknown engine; choose one of tiny, hf, vllm"):
        registry.engine_entry("sglang")
    # a RunConfig built in Python is refused as the command line's choices would refuse it
    assert config_errors(RunConfig(rollout_engine="sglang")) == [
        "argument --rollout-engine: 'sglang' is out of range; it must be one of tiny, hf, vllm"]
    assert in_process_refusal(RunConfig(rollout_engine="sglang")) is None  # reported by config_errors


def test_a_registered_engine_gets_the_shared_rules_from_what_it_declares(recording_engine):
    # it samples from the built-in model: a checkpoint is refused, and the engines that take one are named
    (error,) = config_errors(RunConfig(rollout_engine="recording", hf_checkpoint="/m"))
    assert error.startswith("--rollout-engine recording samples from the built-in model, not "
                            "--hf-checkpoint /m: use --rollout-engine hf or vllm")
    # its sampling flags are the tiny engine's: top-k passes, stop strings are refused naming vLLM
    assert config_errors(RunConfig(rollout_engine="recording", rollout_top_k=3)) == []
    (error,) = config_errors(RunConfig(rollout_engine="recording", rollout_stop=("x",)))
    assert "the recording engine would ignore it: add --rollout-engine vllm (with --hf-checkpoint)" in error
    # it is listed where an engine that runs in the driver's process is listed
    assert "in-process runs the tiny and hf and recording engines only" in in_process_refusal(
        RunConfig(rollout_engine="vllm", hf_checkpoint="/m"))


@pytest.mark.timeout(300)
def test_relax_train_runs_an_engine_added_by_one_registry_entry(recording_engine, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["train", "--rollout-engine", "recording", "--in-process", "--num-rollout", "2",
                 "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-eval", "--no-progress",
                 "--output-dir", str(out)])
    assert code in (0, None), capsys.readouterr().err[-3000:]
    built = sys.modules[MODULE].BUILT
    assert len(built) == 1 and built[0].generate_calls >= 2  # the run's one rollout worker sampled with it
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    # reports_behaviour_log_probs = True: its log-probs travelled to the trainer, which measured them
    # against its own (the same model in the same dtype: only float rounding apart)
    for row in steps:
        assert math.isfinite(row["rollout/logprob_abs_diff"]) and row["rollout/logprob_abs_diff"] < 1e-4, row


def test_the_command_line_offers_a_registered_engine_and_no_other(recording_engine, capsys):
    assert main(["train", "--rollout-engine", "recording", "--dry-run"]) in (0, None)
    with pytest.raises(SystemExit):
        main(["train", "--rollout-engine", "sglang", "--dry-run"])
    assert "invalid choice: 'sglang'" in capsys.readouterr().err
