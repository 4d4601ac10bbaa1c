"""The bad-input table: each mistake a user can make before training exits with status 2, one
``relax train: error:`` message naming the flag, file, line, sample or key, no traceback, and leaves
every file the user had untouched. Pre-flight (relax/runtime/preflight/) runs these checks before any
process starts, in ``--dry-run`` too.

The table runs ``relax.cli.main.main`` in-process with ``run_train`` replaced by a stub that fails the
test: if a mistake got past pre-flight, nothing would start. A few cases at the end check that the
fixes the messages suggest pass, and that the lock and SIGTERM behave in a real process.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import relax.runtime.preflight.rewards as preflight_rewards
from relax.cli.config_file import write_effective_config
from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig

pytestmark = pytest.mark.real_preflight  # pre-flight is what these test (tests/cli/conftest.py)

REWARDS_MODULE = "relax_bad_input_rewards"
REWARDS_SOURCE = textwrap.dedent(
    """
    import time

    def good(prompt, completion, label, metadata):
        return float(completion.strip() == str(label))

    def raises(prompt, completion, label, metadata):
        return float(int(completion))

    def nan(prompt, completion, label, metadata):
        return float("nan")

    def inf(prompt, completion, label, metadata):
        return float("inf")

    def text(prompt, completion, label, metadata):
        return "1.0"

    def none(prompt, completion, label, metadata):
        return None

    def boolean(prompt, completion, label, metadata):
        return completion == str(label)

    def huge(prompt, completion, label, metadata):
        return 1e39

    def wrong_key(prompt, completion, label, metadata):
        return {"accuracy": 1.0}

    def hangs(prompt, completion, label, metadata):
        time.sleep(20)
        return 0.0

    def two_args(prompt, completion):
        return 0.0

    def label_number(prompt, completion, label, metadata):
        return float(int(label) == 0)

    async def exits_async(prompt, completion, label, metadata):
        raise SystemExit(5)

    def filter_two_args(rewards, group_ids):
        return group_ids >= 0

    def post_process_one_arg(rewards):
        return rewards[:, 0].float()
    """
)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rewards_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bad_input_rewards")
    (directory / f"{REWARDS_MODULE}.py").write_text(REWARDS_SOURCE)
    (directory / "relax_boom_algo.py").write_text("raise RuntimeError('boom at import')\n")
    (directory / "relax_init_algo.py").write_text(textwrap.dedent(
        """
        from relax.algorithms.grpo import GRPO

        class NeedsTemperature(GRPO):
            def __init__(self, config):
                super().__init__(config)
                raise ValueError("set MY_TEMPERATURE first")
        """
    ))
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))
    for name in (REWARDS_MODULE, "relax_boom_algo", "relax_init_algo"):
        sys.modules.pop(name, None)
    from relax.algorithms.base import AlgorithmMeta

    AlgorithmMeta.defined[:] = [c for c in AlgorithmMeta.defined if c.__module__ != "relax_init_algo"]


@pytest.fixture
def ws(tmp_path, monkeypatch, rewards_dir):
    """A user's working directory holding good and bad inputs; the test runs in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight_rewards, "REWARD_PREFLIGHT_TIMEOUT_S", 1.0)
    d = tmp_path
    (d / "good.jsonl").write_text('{"prompt": "<bos>1+2=", "label": 3}\n{"prompt": "<bos>4+4=", "label": 8}\n')
    (d / "bad_json.jsonl").write_text('{"prompt": "<bos>1+2=", "label": 3}\n{"prompt": "<bos>1+\n')
    (d / "no_prompt.jsonl").write_text('{"prompt": "<bos>1+2=", "label": 3}\n{"question": "x", "label": 1}\n')
    (d / "no_label.jsonl").write_text('{"prompt": "<bos>1+2="}\n')
    (d / "latin1.jsonl").write_bytes('{"prompt": "caf\u00e9", "label": 1}\n'.encode("latin-1"))
    (d / "empty.jsonl").write_text("\n\n")
    (d / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "label": pa.array([], pa.int64())}),
                   str(d / "empty.parquet"))
    (d / "data.csv").write_text("prompt,label\n1+2=,3\n")
    (d / "number_prompt.jsonl").write_text('{"prompt": 12, "label": 3}\n')
    (d / "array_row.jsonl").write_text('["<bos>1+2=", 3]\n')
    (d / "messages.jsonl").write_text('{"prompt": [{"role": "user", "content": "1+2="}], "label": 3}\n')
    hf = d / "hf_no_config"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    hf_bad = d / "hf_bad_config"
    hf_bad.mkdir()
    (hf_bad / "config.json").write_text("{not json")
    hf_empty = d / "hf_no_weights"
    hf_empty.mkdir()
    (hf_empty / "config.json").write_text('{"model_type": "llama"}')
    (d / "a_file").write_text("I am a file\n")
    for name, model_type in (("hf_unknown_arch", "no_such_arch"), ("hf_no_tokenizer", "llama")):
        (d / name).mkdir()
        (d / name / "config.json").write_text(f'{{"model_type": "{model_type}"}}')
        (d / name / "model.safetensors").write_bytes(b"")
    (d / "twice.yaml").write_text("lr: 0.001\nseed: 3\nlr: 0.01\n")
    (d / "unreadable.yaml").write_bytes(b"lr: [0.1\n")
    # another run's directory, with the config.yaml relax wrote for it
    run = d / "old_run"
    task_keys = AlgorithmConfig(reward_keys=("correct", "digits", "format", "length"))
    write_effective_config(RunConfig(algorithm=task_keys, output_dir=str(run), run_name="old_run", num_rollout=20))
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(1, 21)))
    ckpts = d / "ckpts"
    ckpts.mkdir()
    (ckpts / "empty.pt").write_bytes(b"")
    (ckpts / "garbage.pt").write_bytes(os.urandom(256))
    torch.save(_state(), ckpts / "full.pt")
    (ckpts / "truncated.pt").write_bytes((ckpts / "full.pt").read_bytes()[:100])
    torch.save({"step": 3}, ckpts / "partial.pt")
    torch.save([1, 2, 3], ckpts / "a_list.pt")
    torch.save(_state(advantage_estimator="rloo"), ckpts / "rloo.pt")
    torch.save(_state(step=50), ckpts / "step50.pt")
    torch.save(_state(backend="megatron"), ckpts / "megatron.pt")
    torch.save(_state(advantage_estimator="ppo"), ckpts / "ppo_without_critic.pt")
    torch.save(_state(rollout={"prompts": {"seed": 7, "counter": 64}}), ckpts / "seed7.pt")
    (d / "no_ckpt_run").mkdir()
    resumable = d / "resumable"
    (resumable / "checkpoints" / "step_000002").mkdir(parents=True)
    torch.save(_state(), resumable / "checkpoints" / "step_000002" / "state.pt")
    (resumable / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    return d


def _state(**changes) -> dict:
    state = {"step": 2, "actor": {"backend": {"model": {}, "optimizer": {}, "step": 0}}, "rollout": {},
             "critic": None, "advantage_estimator": "grpo", "backend": "torch"}
    return {**state, **changes}


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def refuse(cli, ws, monkeypatch):
    """Run ``relax train ARGV``; assert exit 2, one error line, no traceback, nothing changed in ws."""

    def must_not_start(config):
        raise AssertionError("pre-flight let a bad input through: the run would have started")

    monkeypatch.setattr("relax.cli.main.run_train", must_not_start)

    def run(*argv, dry_run: bool = True) -> str:
        before = _snapshot(ws)
        code, out, err = cli("train", *argv, *(["--dry-run"] if dry_run else []))
        assert code == 2, err
        assert "Traceback" not in err
        assert err.count("relax train: error:") == 1, err
        assert out == ""
        assert _snapshot(ws) == before, "a file the user had was changed"
        assert not (ws / "outputs").exists(), "a rejected run created its output directory"
        return err

    return run


# -- the table -----------------------------------------------------------------------------------

R = REWARDS_MODULE
DATA = "--prompt-data"
RM = "--custom-rm-path"

CASES = [
    # prompt data
    ("jsonl_bad_json", [DATA, "bad_json.jsonl", RM, f"{R}:good"], "line 2: not valid JSON"),
    ("jsonl_missing_prompt", [DATA, "no_prompt.jsonl", RM, f"{R}:good"], "line 2: missing --input-key 'prompt'"),
    ("jsonl_missing_label", [DATA, "no_label.jsonl", RM, f"{R}:good"], "line 1: missing --label-key 'label'"),
    ("jsonl_not_utf8", [DATA, "latin1.jsonl", RM, f"{R}:good"], "line 1: not UTF-8 text"),
    ("jsonl_empty", [DATA, "empty.jsonl", RM, f"{R}:good"], "holds no prompts"),
    ("parquet_empty", [DATA, "empty.parquet", RM, f"{R}:good"], "holds no prompts (it has no rows)"),
    ("parquet_corrupt", [DATA, "broken.parquet", RM, f"{R}:good"], "is not a readable Parquet file"),
    ("data_unknown_type", [DATA, "data.csv", RM, f"{R}:good"], "unknown file type '.csv'"),
    ("data_missing_file", [DATA, "nope.jsonl", RM, f"{R}:good"], "--prompt-data nope.jsonl: no such file"),
    ("prompt_not_text", [DATA, "number_prompt.jsonl", RM, f"{R}:good"], "must be a string or a list of messages"),
    ("row_not_object", [DATA, "array_row.jsonl", RM, f"{R}:good"], "line 1: expected a JSON object, got list"),
    ("all_prompts_too_long", [DATA, "good.jsonl", RM, f"{R}:good", "--max-prompt-len", "1"], "raise --max-prompt-len"),
    ("messages_without_template", [DATA, "messages.jsonl", RM, f"{R}:good"],
     "needs --apply-chat-template and a tokenizer with a chat template"),
    ("chat_template_missing", [DATA, "good.jsonl", RM, f"{R}:good", "--apply-chat-template"], "has no chat template"),
    ("data_without_reward_fn", [DATA, "good.jsonl"], "produces only correct, digits, format, length, never 'reward'"),
    # reward functions
    ("reward_raises", [DATA, "good.jsonl", RM, f"{R}:raises"], "line 1, completion '': reward function"),
    ("reward_nan", [DATA, "good.jsonl", RM, f"{R}:nan"], "'reward' = nan, which is not finite"),
    ("reward_inf", [DATA, "good.jsonl", RM, f"{R}:inf"], "'reward' = inf, which is not finite"),
    ("reward_str", [DATA, "good.jsonl", RM, f"{R}:text"], "returned '1.0' of type str"),
    ("reward_none", [DATA, "good.jsonl", RM, f"{R}:none"], "returned None of type NoneType"),
    ("reward_bool", [DATA, "good.jsonl", RM, f"{R}:boolean"], "a bool; return a number"),
    ("reward_huge", [DATA, "good.jsonl", RM, f"{R}:huge"], "overflows float32"),
    ("reward_missing_key", [DATA, "good.jsonl", RM, f"{R}:wrong_key"], "returned no component 'reward'"),
    ("reward_hangs", [DATA, "good.jsonl", RM, f"{R}:hangs"], "did not return within 1s"),
    ("reward_signature", [DATA, "good.jsonl", RM, f"{R}:two_args"], "must accept (prompt, completion, label, metadata)"),
    ("reward_not_found", [RM, f"{R}:missing_function"], R),
    ("task_unknown_with_data", [DATA, "good.jsonl", RM, f"{R}:good", "--task", "nope"], "unknown task 'nope' (--task)"),
    ("task_reward_keys", ["--reward-keys", "correct", "brevity"], "never 'brevity'"),
    # models
    ("hf_without_config", ["--hf-checkpoint", "hf_no_config"], "has no config.json"),
    ("hf_config_not_json", ["--hf-checkpoint", "hf_bad_config"], "config.json is not valid JSON"),
    ("hf_without_weights", ["--hf-checkpoint", "hf_no_weights"], "no model weights"),
    ("hf_unknown_architecture", ["--hf-checkpoint", "hf_unknown_arch"], "transformers cannot read its config.json"),
    ("hf_without_tokenizer", ["--hf-checkpoint", "hf_no_tokenizer"], "the directory needs the tokenizer files"),
    ("hf_is_a_file", ["--hf-checkpoint", "a_file"], "is a file, not a directory"),
    ("algorithm_raises_on_import", ["--advantage-estimator", "relax_boom_algo:Algo"], "boom at import"),
    # configuration files
    ("yaml_key_twice", ["--config", "twice.yaml"], "key 'lr' is written twice (lines 1 and 3); keep one"),
    ("yaml_invalid", ["--config", "unreadable.yaml"], "is not valid YAML"),
    ("yaml_missing", ["--config", "nope.yaml"], "--config nope.yaml: cannot read nope.yaml"),
    ("algorithm_constructor_raises", ["--advantage-estimator", "relax_init_algo:NeedsTemperature"],
     "NeedsTemperature(config) raised ValueError: set MY_TEMPERATURE first"),
    # seed
    ("seed_too_large", ["--seed", str(10**20)], "argument --seed: 100000000000000000000 is out of range"),
    ("seed_negative", ["--seed", "-1"], "argument --seed: -1 is out of range"),
    # output directory
    ("output_dir_is_file", ["--output-dir", "a_file"], "--output-dir a_file is a file, not a directory"),
    ("output_dir_under_file", ["--output-dir", "a_file/run"], "a_file is a file, so the directory cannot be created"),
    ("output_dir_holds_run", ["--output-dir", "old_run"], "--output-dir old_run already holds a run (metrics.jsonl with 20 steps)"),
    ("output_dir_holds_resumable_run", ["--output-dir", "resumable"],
     ("already holds a run (metrics.jsonl with 2 steps, 1 checkpoint); relax never writes over a run: choose "
      "another --output-dir, add --load resumable to resume it or pass --overwrite-output-dir")),
    ("config_of_another_run", ["--config", "old_run/config.yaml"], "already holds a run (metrics.jsonl with 20 steps)"),
    # --load
    ("load_no_checkpoint", ["--load", "no_ckpt_run"], "--load no_ckpt_run: no checkpoint found"),
    ("load_empty_file", ["--load", "ckpts/empty.pt"], "the checkpoint file is empty"),
    ("load_garbage", ["--load", "ckpts/garbage.pt"], "not a readable relax checkpoint"),
    ("load_truncated", ["--load", "ckpts/truncated.pt"], "not a readable relax checkpoint"),
    ("load_incomplete", ["--load", "ckpts/partial.pt"], "incomplete checkpoint, missing actor, rollout, critic"),
    ("load_not_a_dict", ["--load", "ckpts/a_list.pt"], "holds a list, not a relax checkpoint"),
    ("load_other_method", ["--load", "ckpts/rloo.pt"], "trained with --advantage-estimator 'rloo'"),
    ("load_past_the_end", ["--load", "ckpts/step50.pt", "--num-rollout", "50"], "nothing left to train"),
    ("load_other_backend", ["--load", "ckpts/megatron.pt"], "written by --backend megatron"),
    ("load_critic_mismatch", ["--load", "ckpts/ppo_without_critic.pt", "--advantage-estimator", "ppo"],
     "disagree on whether a critic exists"),
    ("load_other_seed", ["--load", "ckpts/seed7.pt"], "trained with --seed 7, this run has --seed 1234"),
    # cluster
    ("ray_address_dead", ["--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: nothing answers"),
    # resuming into another run's directory would write over its metrics
    ("load_into_another_run", ["--load", "resumable", "--output-dir", "old_run"],
     ("--output-dir old_run already holds another run (metrics.jsonl with 20 steps) and --load resumable resumes "
      "the run in resumable")),
    ("load_file_into_a_run", ["--load", "ckpts/full.pt", "--output-dir", "old_run"],
     "resumes a checkpoint kept outside any run directory"),
    # keeping checkpoints, timing reward calls
    ("keep_checkpoints_zero", ["--keep-checkpoints", "0"], "argument --keep-checkpoints: must be"),
    ("reward_timeout_zero", ["--reward-timeout", "0"], "argument --reward-timeout: must be > 0"),
    ("reward_over_timeout", [DATA, "good.jsonl", RM, f"{R}:hangs", "--reward-timeout", "0.5"],
     "did not return within --reward-timeout 0.5s"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_anything_starts(refuse, argv, message):
    err = refuse(*argv)
    assert message in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["--output-dir", "old_run"], "already holds a run"),
    ([DATA, "bad_json.jsonl", RM, f"{R}:good"], "line 2: not valid JSON"),
    (["--load", "ckpts/garbage.pt"], "not a readable relax checkpoint"),
], ids=["output_dir", "data", "load"])
def test_without_dry_run_too(refuse, argv, message):
    assert message in refuse(*argv, dry_run=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_output_dir(refuse, ws):
    locked = ws / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert "is not writable" in refuse("--output-dir", "locked/run")
    finally:
        locked.chmod(0o700)


def test_the_table_is_large_enough():
    assert len({c[0] for c in CASES}) == len(CASES) >= 40


# -- the fixes the messages suggest pass ----------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [
    ["--output-dir", "new_run"],                               # instead of another run's directory
    ["--output-dir", "old_run", "--overwrite-output-dir"],     # or replace it
    ["--config", "old_run/config.yaml", "--output-dir", "repeat"],  # the config.yaml header's recipe
    [DATA, "good.jsonl", "--reward-keys", "correct", "digits", "format", "length"],
    [DATA, "good.jsonl", RM, f"{R}:good"],
    ["--advantage-estimator", "gdpo", "--reward-keys", "correct", "digits", "format", "length"],
    ["--seed", str(2**32 - 1)],
    ["--load", "ckpts/step50.pt", "--num-rollout", "51"],
    ["--load", "ckpts/full.pt"],
    ["--output-dir", "resumable", "--load", "resumable"],
    ["--load", "ckpts/seed7.pt", "--seed", "7"],
    ["--load", "ckpts/rloo.pt", "--advantage-estimator", "rloo"],
    [DATA, "no_label.jsonl", RM, f"{R}:good", "--label-key", ""],
    ["--load", "resumable", "--output-dir", "resumable_continued"],
    ["--load", "resumable/checkpoints/step_000002", "--output-dir", "resumable"],
    [DATA, "good.jsonl", RM, f"{R}:good", "--reward-timeout", "5", "--keep-checkpoints", "2"],
], ids=["new_dir", "overwrite", "config_new_dir", "task_keys", "reward_fn", "gdpo_task_keys", "seed_max",
        "more_steps", "good_checkpoint", "resume_in_place", "resume_seed", "resume_method", "no_labels",
        "resume_new_dir", "resume_step_in_place", "timeout_and_keep"])
def test_suggested_fixes_pass(cli, ws, argv):
    before = _snapshot(ws)
    code, _, err = cli("train", *argv, "--dry-run")
    assert code == 0, err
    assert _snapshot(ws) == before  # --dry-run writes nothing, --overwrite-output-dir included


def test_dropped_prompts_are_one_relax_warning(cli, ws):
    (ws / "mixed.jsonl").write_text('{"prompt": "<bos>1+2=", "label": 3}\n{"prompt": "<bos>1+2=<a>3</a>", "label": 3}\n')
    code, _, err = cli("train", DATA, "mixed.jsonl", RM, f"{R}:good", "--max-prompt-len", "6", "--dry-run")
    assert code == 0, err
    expected = (
        "relax train: warning: --prompt-data mixed.jsonl: dropped 1 of 2 prompts longer than --max-prompt-len 6 "
        "tokens, e.g. line 2 (8 tokens)"
    )
    assert err.strip().splitlines() == [expected]


def test_gdpo_one_key_message_names_fixes_that_pass(cli, ws):
    code, _, err = cli("train", "--advantage-estimator", "gdpo", "--reward-keys", "correct", "--dry-run")
    assert code == 2 and "or --reward-keys correct digits format length (the components of --task addition)" in err


def test_written_config_never_sets_overwrite(ws):
    path = write_effective_config(RunConfig(output_dir=str(ws / "r"), overwrite_output_dir=True))
    text = path.read_text()
    assert "overwrite_output_dir: false" in text and "--output-dir NEW_DIR" in text


# -- the run directory lock, --overwrite-output-dir at run time -------------------------------------

HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from relax.runtime.files.run_dir import lock_run_dir
    lock = lock_run_dir(sys.argv[1])
    print("locked", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.timeout(60)
def test_a_second_run_on_a_locked_directory_is_refused(refuse, ws):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(ws / "busy")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        err = refuse("--output-dir", "busy", dry_run=False)
        assert "--output-dir busy is in use by another relax run" in err and f"pid {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait()
    from relax.runtime.files.run_dir import lock_run_dir

    lock_run_dir(ws / "busy").release()  # the kernel dropped the dead holder's lock


def test_lock_is_reentrant_in_one_process_and_released(tmp_path):
    from relax.runtime.files.run_dir import RunDirError, lock_holder, lock_run_dir

    lock = lock_run_dir(tmp_path / "r")
    assert lock_run_dir(tmp_path / "r") is lock and lock_holder(tmp_path / "r") is None
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1}\n')
    lock.release()
    with pytest.raises(RunDirError, match="already holds a run"):
        lock_run_dir(tmp_path / "r")
    lock_run_dir(tmp_path / "r", resuming=True).release()
    assert (tmp_path / "r" / "metrics.jsonl").exists()


def test_overwrite_output_dir_clears_only_the_old_run(tmp_path):
    from relax.runtime.files.run_dir import lock_run_dir

    run = tmp_path / "r"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"x")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "notes.txt").write_text("mine")
    lock_run_dir(run, overwrite=True).release()
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    assert (run / "notes.txt").read_text() == "mine"


# -- errors that travel -----------------------------------------------------------------------------


def test_run_errors_pickle_intact():
    import pickle

    from relax.algorithms.types import AlgorithmOutputError
    from relax.rollout.prompt_files import PromptDataError
    from relax.rollout.rewards import RewardError
    from relax.runtime.files.checkpoint_files import CheckpointError
    from relax.runtime.files.run_dir import RunDirError

    data_error = PromptDataError("d.jsonl", [(2, "not valid JSON"), (5, "missing --input-key 'prompt'")], "line")
    copy = pickle.loads(pickle.dumps(data_error))
    assert str(copy) == str(data_error) and copy.errors == data_error.errors and "line 5" in str(copy)
    from relax.runtime.checks.validation import ConfigError

    assert pickle.loads(pickle.dumps(ConfigError(["a", "b"]))).errors == ["a", "b"]
    for cls in (RewardError, CheckpointError, RunDirError, AlgorithmOutputError):
        assert str(pickle.loads(pickle.dumps(cls("msg")))) == "msg"


def test_ray_address_without_listener_fails_fast():
    from relax.runtime.preflight.ray_address import check_ray_address

    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="--ray-address 127.0.0.1:1: nothing answers"):
        check_ray_address("127.0.0.1:1", timeout=2)
    assert time.monotonic() - t0 < 10
    check_ray_address("auto")  # left to Ray


def test_sigterm_shuts_down_like_ctrl_c(cli, ws, monkeypatch):
    """The handler turns SIGTERM into the KeyboardInterrupt path (exit 143, one line)."""
    calls = []

    def run_train(config):
        calls.append(config)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler
        raise AssertionError("SIGTERM was not delivered as an interrupt")

    monkeypatch.setattr("relax.cli.main.run_train", run_train)
    previous = signal.getsignal(signal.SIGTERM)
    code, _, err = cli("train", "--output-dir", "sig")
    assert code == 143 and calls and "relax train: terminated (SIGTERM)" in err
    assert signal.getsignal(signal.SIGTERM) == previous  # restored


def test_worker_failure_is_one_line(monkeypatch, cli, ws):
    """A RayTaskError-wrapped failure inside a worker is printed once, in relax's words, exit 1."""
    from relax.algorithms.types import AlgorithmOutputError
    from relax.runtime.session.waits import WorkerDied

    class FakeRayTaskError(Exception):
        def __init__(self, cause):
            super().__init__("Traceback (most recent call last): ... long remote traceback")
            self.cause = cause

    def run_train(config):
        cause = AlgorithmOutputError("MyGRPO.policy_loss at step 3 returned a non-finite loss (nan)")
        try:
            raise FakeRayTaskError(cause)
        except FakeRayTaskError as exc:
            raise WorkerDied(f"the actor/critic worker failed: {exc}") from exc

    monkeypatch.setattr("relax.cli.main.run_train", run_train)
    code, _, err = cli("train", "--output-dir", "w")
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "relax train: error: the actor/critic worker failed: AlgorithmOutputError: MyGRPO.policy_loss at step 3 "
        "returned a non-finite loss (nan)"
    )
    assert "Traceback" not in err


# -- real runs: a few, end to end -----------------------------------------------------------------

RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}


def _trained_steps(metrics: Path) -> int:
    """Training steps logged so far (not the evaluation before training, logged as step 0)."""
    text = metrics.read_text() if metrics.exists() else ""
    return sum(1 for line in text.splitlines() if line.strip() and not line.startswith('{"step": 0,'))


def _relax(*argv, cwd) -> subprocess.Popen:
    script = "import sys; from relax.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", script, "train", *argv], cwd=cwd, env=RUN_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_running_run_is_locked_and_sigterm_shuts_it_down_like_ctrl_c(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = _relax("--num-rollout", "400", "--output-dir", "live", "--no-progress", cwd=tmp_path)
    metrics = tmp_path / "live" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not _trained_steps(metrics) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert run.poll() is None, run.communicate()[1]
        # a second run on the same directory is refused, naming the directory and the process
        code, _, err = cli("train", "--output-dir", "live")
        assert code == 2 and "--output-dir live is in use by another relax run" in err and f"pid {run.pid}" in err
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 143, stderr
    assert "relax train: terminated (SIGTERM)" in stderr and "relax: interrupted; shutting down" in stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr
    # the model of the last trained step was saved before the workers went down, and says where
    steps = _trained_steps(metrics)
    saved = tmp_path / "live" / "checkpoints" / f"step_{steps:06d}" / "state.pt"
    assert f"relax: saved step {steps} to live{os.sep}checkpoints{os.sep}step_{steps:06d}" in stderr, stderr
    assert torch.load(saved, weights_only=False)["step"] == steps
    # the repeat-this-run recipe without a new directory is refused and keeps the metrics
    kept = metrics.read_text()
    code, _, err = cli("train", "--config", "live/config.yaml")
    assert code == 2 and "--output-dir live already holds a run" in err
    assert metrics.read_text() == kept


NAN_LOSS = textwrap.dedent(
    """
    from relax.algorithms.grpo import GRPO

    class NaNLoss(GRPO):
        def policy_loss(self, inputs):
            out = super().policy_loss(inputs)
            return type(out)(loss=out.loss * float("nan"), metrics=out.metrics)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_users_nan_loss_stops_the_run_with_one_line(tmp_path):
    (tmp_path / "relax_nan_loss.py").write_text(NAN_LOSS)
    run = _relax("--advantage-estimator", "relax_nan_loss:NaNLoss", "--num-rollout", "3", "--output-dir", "nan",
                 "--no-progress", cwd=tmp_path)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "relax train: error: the actor/critic worker failed: AlgorithmOutputError: NaNLoss.policy_loss"
    ), stderr
    assert "returned a non-finite loss (nan)" in stderr and stderr.count("relax train: error:") == 1


# -- issue 25: no silent no-op, damaged run files, full disks, user code that exits -----------------


def _warns(cli, ws, *argv) -> str:
    """``relax train ARGV --dry-run``: accepted (exit 0) with exactly one warning, nothing changed."""
    before = _snapshot(ws)
    code, _, err = cli("train", *argv, "--dry-run")
    assert code == 0, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relax train: warning: "), err
    assert _snapshot(ws) == before and not (ws / "outputs").exists()
    return lines[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["--off-policy-cap", "3"], "--off-policy-cap 3.0 has no effect without --off-policy-correction"),
    (["--input-key", "question"], "--input-key has no effect without --prompt-data"),
    (["--output-dir", "resumable", "--load", "resumable", "--overwrite-output-dir"],
     "--overwrite-output-dir has no effect: --load resumable continues the run in resumable itself"),
    (["--output-dir", "cut_run", "--load", "cut_run"],
     "--load cut_run: cut_run/metrics.jsonl: line 3 is incomplete (40 bytes, not valid JSON"),
], ids=["off_policy_cap_alone", "input_key_without_data", "overwrite_with_own_load", "metrics_partial_last_line"])
def test_no_effect_and_partial_lines_warn(cli, ws, damaged_runs, argv, message):
    assert message in _warns(cli, ws, *argv)


def _cut_run(ws: Path, name: str, tail: bytes) -> Path:
    """A run directory with a checkpoint at step 2 and ``tail`` after its two metrics lines."""
    run = ws / name
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    torch.save(_state(), run / "checkpoints" / "step_000002" / "state.pt")
    (run / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2}\n' + tail)
    return run


@pytest.fixture
def damaged_runs(ws):
    full = b'{"step": 3, "reward/correct/mean": 0.25, "time/step_s": 0.5}\n'
    _cut_run(ws, "cut_run", full[:40])  # a kill -9 or a full disk mid-write
    _cut_run(ws, "garbage_run", b"#!garbage\n" + full)  # damage in the middle
    _cut_run(ws, "binary_run", bytes(range(128, 256)) + b"\n" + full)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["--off-policy-correction", "decoupled", "--off-policy-cap", "0.5"],
     "on-policy tokens have weight 1, so with a cap <= 1 every update would be zero. Pass --off-policy-cap above 1"),
    (["--off-policy-correction", "decoupled", "--off-policy-cap", "1"], "with a cap <= 1 every update would be zero"),
    (["--use-wandb", "--wandb-project", ""], "--wandb-project '' is empty"),
    (["--output-dir", "garbage_run", "--load", "garbage_run"],
     "--load garbage_run: garbage_run/metrics.jsonl: line 3 is not valid JSON"),
    (["--output-dir", "binary_run", "--load", "binary_run"],
     "--load binary_run: binary_run/metrics.jsonl: line 3 is not UTF-8 text"),
], ids=["decoupled_cap_below_one", "decoupled_cap_one", "wandb_project_empty", "metrics_garbage_line",
        "metrics_binary_line"])
def test_issue25_refused_before_anything_starts(refuse, damaged_runs, argv, message):
    err = refuse(*argv)
    assert message in err


def test_a_partial_last_metrics_line_is_dropped_on_resume(tmp_path):
    from relax.runtime.files.metrics_log import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "x"')
    warnings = []
    log = MetricsLog(path, resume_after_step=2, warn=warnings.append)
    assert [r["step"] for r in log.rows] == [1, 2]
    assert path.read_text() == '{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n'  # the steps before it are kept
    assert warnings == [f"{path}: line 3 is incomplete (15 bytes, not valid JSON (Expecting ':' delimiter)), as a "
                        "crash mid-write leaves it; dropped it"]
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n')
    from relax.runtime.files.metrics_log import MetricsFileError

    with pytest.raises(MetricsFileError, match=r"metrics.jsonl: line 2 is a JSON list, not an object"):
        MetricsLog(path, resume_after_step=2)
    assert path.read_text() == '{"step": 1}\n[1, 2]\n{"step": 2}\n'  # untouched


class _FakeActor:
    def __init__(self, state):
        self.state = state

    @property
    def state_dict(self):
        return type("Remote", (), {"remote": lambda _self: self.state})()


def _fake_runtime(keep=None):
    import types

    config = types.SimpleNamespace(advantage_estimator="grpo", backend="torch", hf_checkpoint=None,
                                   keep_checkpoints=keep, algorithm=AlgorithmConfig())
    backend = types.SimpleNamespace(gathers_on_all_ranks=False)
    return types.SimpleNamespace(actors=[_FakeActor({"backend": {"model": {"w": torch.ones(4096)}}})],
                                 rollouts=[_FakeActor({})], critic=None, config=config, backend_cls=backend)


@pytest.fixture
def no_ray_get(monkeypatch):
    monkeypatch.setattr("relax.runtime.session.waits.get", lambda refs, what, timeout=None: list(refs))


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_full_disk_while_saving_is_one_line_and_leaves_no_partial_files(tmp_path, monkeypatch, no_ray_get):
    import errno

    from relax.runtime.driver import checkpoints as C
    from relax.runtime.files.checkpoint_files import CheckpointSaveError, read_checkpoint

    runtime = _fake_runtime(keep=1)
    out = tmp_path / "run"
    first = C.save_checkpoint(runtime, out, 1)
    before = _files(out)
    real_save = torch.save

    def disk_full(state, f):  # what torch does when the disk fills: a RuntimeError over the OSError
        f.write(b"x" * 100)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 581952 vs 581844")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointSaveError) as info:
        C.save_checkpoint(runtime, out, 2)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"saving the checkpoint of step 2 to {out / 'checkpoints' / 'step_000002'} failed: "
                              "No space left on device (")
    assert message.endswith(f"its partial files were removed and the last good checkpoint is {first.parent} "
                            f"(resume with --load {first.parent})")
    assert _files(out) == before  # no state.tmp, no empty step directory, and step 1 was not pruned
    monkeypatch.setattr(torch, "save", real_save)
    assert read_checkpoint(str(out))[1]["step"] == 1
    # the CLI prints it as one error line (exit 1)
    from relax.cli.main import _run_error_message

    assert _run_error_message(info.value) == message


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


@pytest.mark.timeout(60)
def test_a_real_full_disk(tmp_path, no_ray_get):
    """The same on a 1 MiB tmpfs (needs root and mount): a real full disk, the checkpoint and the plot."""
    from relax.cli.plot import write_run_plot
    from relax.runtime.driver import checkpoints as C
    from relax.runtime.files.checkpoint_files import CheckpointSaveError

    disk = tmp_path / "disk"
    if not _tmpfs(disk, "1m"):
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    try:
        runtime = _fake_runtime()
        runtime.actors[0].state = {"backend": {"model": {"w": torch.ones(16)}}}
        first = C.save_checkpoint(runtime, disk, 1)
        runtime.actors[0].state = {"backend": {"model": {"w": torch.ones(400_000)}}}  # 1.6 MB
        with pytest.raises(CheckpointSaveError, match="step 2 .* failed: No space left on device") as info:
            C.save_checkpoint(runtime, disk, 2)
        assert f"the last good checkpoint is {first.parent}" in str(info.value)
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["step_000001"]
        assert sorted(p.name for p in first.parent.iterdir()) == ["state.pt"]  # no state.tmp
        rows = "".join(f'{{"step": {i}, "reward/correct/mean": 0.5}}\n' for i in range(1, 4))
        (disk / "metrics.jsonl").write_text(rows)
        with open(disk / "filler", "wb") as f:  # fill what is left
            with pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        write_run_plot(disk)
        assert not (disk / "rewards.png").exists()  # no zero-byte image
        assert not [p for p in disk.iterdir() if p.name.endswith(".partial")]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_reward_function_that_exits_is_one_line(refuse, ws):
    (ws / "relax_exits_reward.py").write_text(
        "import sys\n\ndef reward(prompt, completion, label, metadata):\n    sys.exit(3)\n")
    err = refuse(DATA, "good.jsonl", RM, "relax_exits_reward:reward")
    assert "reward function relax_exits_reward.reward raised SystemExit: 3" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["--dynamic-sampling-filter-path", f"{R}:filter_two_args"],
     f"--dynamic-sampling-filter-path '{R}:filter_two_args': filter_two_args must accept (rewards, group_ids, "
     "samples, keep); its signature is (rewards, group_ids)"),
    (["--custom-reward-post-process-path", f"{R}:post_process_one_arg"],
     f"--custom-reward-post-process-path '{R}:post_process_one_arg': post_process_one_arg must accept (rewards, "
     "group_ids, samples); its signature is (rewards)"),
], ids=["filter_signature", "post_process_signature"])
def test_hook_signatures_are_bound_before_start_up(refuse, argv, message):
    assert message in refuse(*argv)


def test_a_hook_that_exits_is_a_hook_error():
    import sys as _sys

    from relax.rollout.hooks import HookError, call_keep_filter

    def exits(rewards, group_ids, samples, keep):
        _sys.exit(4)

    ids = torch.tensor([0, 0, 1, 1])
    with pytest.raises(HookError, match=r"--dynamic-sampling-filter-path 'm:exits' \(step 2\) called sys.exit\(4\) \(SystemExit\)"):
        call_keep_filter(exits, "m:exits", 2, torch.zeros(4, 1), ids, [{}] * 4, torch.ones(4, dtype=torch.bool))


def test_a_users_advantages_shape_is_checked():
    from relax.algorithms.grpo import GRPO
    from relax.algorithms.types import AlgorithmOutputError, check_advantages_output

    grpo = GRPO(AlgorithmConfig())
    check_advantages_output(grpo, (torch.zeros(3, 5), torch.zeros(3, 5)), (3, 5))
    with pytest.raises(AlgorithmOutputError, match=r"^GRPO.compute_advantages at step 4 returned advantages of "
                                                   r"shape \(3, 1\), expected \(3, 5\): one value per response token"):
        check_advantages_output(grpo, (torch.zeros(3, 1), torch.zeros(3, 5)), (3, 5), step=4)
    with pytest.raises(AlgorithmOutputError, match=r"returned a Tensor; it must return \(advantages, returns\)"):
        check_advantages_output(grpo, torch.zeros(3, 5), (3, 5))
    with pytest.raises(AlgorithmOutputError, match=r"returned returns as a torch.int64 tensor"):
        check_advantages_output(grpo, (torch.zeros(3, 5), torch.zeros(3, 5, dtype=torch.long)), (3, 5))


def test_a_builtin_methods_non_finite_loss_points_at_the_learning_rate():
    from relax.algorithms.grpo import GRPO
    from relax.algorithms.types import AlgorithmOutputError, PolicyLossOutput, check_policy_loss_output

    with pytest.raises(AlgorithmOutputError) as info:
        check_policy_loss_output(GRPO(AlgorithmConfig()), PolicyLossOutput(loss=torch.tensor(float("nan"))), step=3)
    assert str(info.value).startswith("GRPO.policy_loss at step 3 returned a non-finite loss (nan): the built-in "
                                      "method's loss is finite on finite inputs")
    assert "lower --lr" in str(info.value)


# -- run(config) from Python: the CLI's defaults, rules and pre-flight ----------------------------------


def test_run_takes_a_run_config():
    from relax.runtime.driver.train import run

    with pytest.raises(TypeError, match=r"^run\(\) takes a RunConfig, got a dict; build one from it: "
                                        r"run\(RunConfig\(num_rollout=\.\.\.\)\)"):
        run({"num_rollout": 2})
    with pytest.raises(TypeError, match=r"run\(\) takes a RunConfig \(relax.config.run.RunConfig\), got str"):
        run("run.yaml")


def test_a_default_run_config_trains_on_the_tasks_reward_keys():
    from relax.rollout.tasks import get_task
    from relax.runtime.checks.entry import entry_config

    config = entry_config(RunConfig())
    assert config.algorithm.reward_keys == tuple(get_task("addition").reward_keys) == ("correct", "digits", "format",
                                                                                       "length")
    assert config.algorithm.reward_weights == (1.0, 1.0, 1.0, 1.0)
    mine = RunConfig(custom_rm_path=f"{REWARDS_MODULE}:good")  # a function of the user's keeps the scalar key
    assert entry_config(mine) is mine


@pytest.mark.timeout(60)
def test_run_refuses_what_pre_flight_refuses_before_ray_starts(ws, monkeypatch):
    from relax.runtime.checks.validation import ConfigError
    from relax.runtime.driver.train import run
    from relax.runtime.preflight import PreflightError

    def must_not_start(*args, **kwargs):
        raise AssertionError("run() started the workers with a configuration pre-flight refuses")

    monkeypatch.setattr("relax.runtime.driver.train.Runtime", must_not_start)
    before = _snapshot(ws)
    empty = RunConfig(prompt_data="empty.jsonl", custom_rm_path=f"{R}:good", output_dir=str(ws / "never"))
    with pytest.raises(PreflightError, match=r"--prompt-data empty.jsonl: .*holds no prompts") as info:
        run(empty)
    assert isinstance(info.value, ConfigError) and len(info.value.errors) == 1
    with pytest.raises(PreflightError, match="must accept \\(rewards, group_ids, samples, keep\\)"):
        run(RunConfig(dynamic_sampling_filter_path=f"{R}:filter_two_args", output_dir=str(ws / "never")))
    assert _snapshot(ws) == before and not (ws / "never").exists()


DROP_ALL = textwrap.dedent(
    """
    import torch

    def drop_all(rewards, group_ids, samples, keep):
        return torch.zeros_like(keep)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_filter_that_drops_every_group_warns_each_step_and_fails_the_run(ray_cluster, tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    (ray_cluster / "relax_drop_all.py").write_text(DROP_ALL)
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "dropped"
    argv = ["train", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--output-dir", str(out), "--no-progress", "--no-eval",
            "--dynamic-sampling-filter-path", "relax_drop_all:drop_all"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    for step in (1, 2):
        assert (f"relax: warning: step {step} trained nothing: all 4 prompt groups were dropped by the method's group "
                "filter or --dynamic-sampling-filter-path relax_drop_all:drop_all; the weights are unchanged") in err
    assert err.count("relax train: error:") == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "relax train: error: no step of the run trained: in all 2 steps every prompt group was dropped by the "
        "method's group filter or --dynamic-sampling-filter-path relax_drop_all:drop_all, so the model equals the "
        "initial weights; check that the filter keeps groups (or that the rewards vary within a group)")
    # nothing lost: both steps logged, the final model saved
    from relax.runtime.files.metrics_log import read_metrics

    rows, _ = read_metrics(out / "metrics.jsonl")
    assert [(r["step"], r["train/skipped"]) for r in rows] == [(1, 1), (2, 1)]
    assert torch.load(out / "checkpoints" / "step_000002" / "state.pt", weights_only=False)["step"] == 2


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_default_run_config_runs_the_embedded_default(ray_cluster, tmp_path, monkeypatch):
    from relax.runtime.driver.train import run

    monkeypatch.chdir(tmp_path)
    summary = run(RunConfig(num_rollout=1, output_dir=str(tmp_path / "default")))
    assert summary.steps_run == 1
    assert set(summary.reward_first_last) == {"correct", "digits", "format", "length"}
    assert summary.eval_before is not None and "eval/correct/mean" in summary.eval_after


@pytest.fixture
def odd_files(ws):
    (ws / "latin1.yaml").write_bytes("seed: 3\nrun_name: caf\u00e9\n".encode("latin-1"))
    (ws / "wandb_run").mkdir()
    (ws / "wandb_run" / "wandb").write_text("not a directory\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["--config", "latin1.yaml"], "--config latin1.yaml: latin1.yaml is not UTF-8 text (line 2, byte offset 21: b'\\xe9'); "
                                  "save it as UTF-8"),
    (["--ray-address", "not-an-address"], "--ray-address not-an-address is not an address: give the head node's "
                                          "host:port"),
    (["--ray-address", "127.0.0.1:99999"], "--ray-address 127.0.0.1:99999 is not an address"),
    (["--use-wandb", "--output-dir", "wandb_run"],
     "--use-wandb writes its run to wandb_run/wandb, which is a file, not a directory"),
], ids=["config_not_utf8", "ray_address_format", "ray_address_port", "wandb_dir_is_a_file"])
def test_raw_errors_become_one_line(refuse, odd_files, argv, message):
    if "--use-wandb" in argv:
        pytest.importorskip("wandb")
    assert message in refuse(*argv)


# -- pre-flight knows the model (--hf-checkpoint) ------------------------------------------------------


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parents[1] / "hf"))
    try:
        from tiny_checkpoints import build_checkpoint
    finally:
        sys.path.pop(0)
    return build_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama")


@pytest.fixture
def hf_variants(ws, hf_base):
    """Copies of a good tiny Llama checkpoint in ws, each broken in one way."""
    import shutil

    def variant(name, edit_config=None):
        target = ws / name
        shutil.copytree(hf_base, target)
        if edit_config:
            cfg = json.loads((target / "config.json").read_text())
            edit_config(cfg)
            (target / "config.json").write_text(json.dumps(cfg))
        return target

    variant("hf_good")
    variant("hf_small_vocab", lambda c: c.update(vocab_size=8))
    variant("hf_bert", lambda c: c.update(model_type="bert", architectures=["BertForMaskedLM"]))
    variant("hf_edited", lambda c: c.update(intermediate_size=c["intermediate_size"] * 2))
    cut = variant("hf_truncated")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, message", [
    (["--hf-checkpoint", "hf_small_vocab"], "--hf-checkpoint hf_small_vocab: config.json has vocab_size 8 but the "
                                            "tokenizer has 48 tokens, so token ids 8..47 would index past the embedding"),
    (["--hf-checkpoint", "hf_bert"], "--hf-checkpoint hf_bert: the checkpoint is a BertForMaskedLM, not a causal "
                                     "language model"),
    (["--hf-checkpoint", "hf_edited"], "model.safetensors holds model.layers.0.mlp.down_proj.weight of shape"),
    (["--hf-checkpoint", "hf_truncated"], "--hf-checkpoint hf_truncated: model.safetensors is truncated"),
    (["--hf-checkpoint", "hf_good", "--lora-rank", "4", "--lora-target-modules", "nosuch_proj"],
     "--lora-target-modules nosuch_proj: the model has no module named nosuch_proj; its linear layers are down_proj, "
     "gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
], ids=["vocab_smaller_than_tokenizer", "encoder_only", "config_edited_after_saving", "truncated_safetensors",
        "lora_target_missing"])
def test_pre_flight_knows_the_model(refuse, hf_variants, argv, message):
    assert message in refuse(*argv)


@pytest.mark.timeout(120)
def test_a_good_hf_checkpoint_passes_the_model_checks(cli, ws, hf_variants):
    # prompts and a reward of the user's: the built-in task's reward reads only the tiny vocabulary
    code, _, err = cli("train", "--hf-checkpoint", "hf_good", DATA, "good.jsonl", RM, f"{R}:good", "--lora-rank", "4",
                       "--lora-target-modules", "q_proj", "v_proj", "--dry-run")
    assert code == 0, err


@pytest.mark.timeout(60)
def test_evaluation_prompts_are_probed_like_training_ones(refuse, ws):
    (ws / "eval_words.jsonl").write_text('{"prompt": "<bos>1+2=", "label": "three"}\n')
    err = refuse(DATA, "good.jsonl", RM, f"{R}:label_number", "--eval-prompt-data", "eval_words.jsonl")
    assert ("pre-flight call on --eval-prompt-data eval_words.jsonl line 1, completion '': reward function "
            f"{R}.label_number raised ValueError: invalid literal for int()") in err


@pytest.mark.timeout(60)
def test_an_async_reward_function_that_exits_is_one_line(refuse, ws):
    err = refuse(DATA, "good.jsonl", RM, f"{R}:exits_async")
    assert f"reward function {R}.exits_async raised SystemExit: 5" in err


def test_a_failed_hf_export_keeps_the_whole_state_and_removes_the_partial_export(tmp_path, monkeypatch, no_ray_get):
    import errno
    import types

    from relax.runtime.driver import checkpoints as C
    from relax.runtime.files.checkpoint_files import CheckpointSaveError

    def export_fails(weights, source, target):
        Path(target).mkdir(parents=True)
        (Path(target) / "model.safetensors").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setitem(sys.modules, "relax.models.hf.checkpoint", types.SimpleNamespace(export_hf_checkpoint=export_fails))
    runtime = _fake_runtime()
    runtime.config.hf_checkpoint = "some/hf/dir"
    runtime.backend_cls.weights_in_state = staticmethod(lambda backend: backend["model"])
    with pytest.raises(CheckpointSaveError, match=r"step_000001/hf failed: No space left on device") as info:
        C.save_checkpoint(runtime, tmp_path, 1)
    assert "the last good checkpoint is" in str(info.value) and str(tmp_path / "checkpoints" / "step_000001") in str(info.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "step_000001").iterdir()) == ["state.pt"]


def test_a_dead_worker_is_named_by_its_role_while_saving(tmp_path, monkeypatch):
    from relax.runtime.driver import checkpoints as C
    from relax.runtime.session.waits import WorkerDied

    DEAD = {"dead": True}

    def get(refs, what, timeout=None):
        if any(r is DEAD for r in refs):
            raise WorkerDied(f"the {what} worker died: The actor died unexpectedly before finishing this task.")
        return list(refs)

    monkeypatch.setattr("relax.runtime.session.waits.get", get)
    runtime = _fake_runtime()
    runtime.rollouts = [_FakeActor({}), _FakeActor(DEAD)]
    with pytest.raises(WorkerDied, match=r"^the rollout \(worker 1\) worker died"):
        C.save_checkpoint(runtime, tmp_path, 1)
    runtime = _fake_runtime()
    runtime.rollouts = [_FakeActor(DEAD)]
    with pytest.raises(WorkerDied, match=r"^the rollout worker died"):
        C.save_checkpoint(runtime, tmp_path, 1)
    runtime = _fake_runtime()
    runtime.backend_cls.gathers_on_all_ranks = True
    runtime.actors.append(_FakeActor(DEAD))
    with pytest.raises(WorkerDied, match=r"^the actor \(rank 1\) worker died"):
        C.save_checkpoint(runtime, tmp_path, 1)
    assert not (tmp_path / "checkpoints").exists()  # nothing written for a save that never got the states


def test_rays_node_start_up_timeout_is_one_line(monkeypatch, cli, ws):
    def run_train(config):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr("relax.cli.main.run_train", run_train)
    code, _, err = cli("train", "--output-dir", "slow_machine")
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "relax train: error: Ray did not start: its node timed out during start-up (the raylet or the GCS did not "
        "answer within 30 s, which an overloaded machine does); retry when the machine is less busy, or start Ray "
        "yourself (`ray start --head --num-cpus N`) and pass --ray-address"]


def test_a_metrics_line_that_cannot_be_written_is_one_line(tmp_path):
    from relax.runtime.files.metrics_log import MetricsLog
    from relax.runtime.files.run_errors import RunFailed

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "x": 1.0})
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").mkdir()  # stands for a disk that refuses the write
    with pytest.raises(RunFailed, match=r"metrics.jsonl: writing the metrics of step 2 failed: Is a directory; the "
                                        r"rows before it are kept"):
        log.write({"step": 2, "x": 2.0})
    assert [r["step"] for r in log.rows] == [1]


def test_relax_plot_on_random_bytes_is_one_line(cli, tmp_path):
    import random

    (tmp_path / "noise").mkdir()
    (tmp_path / "noise" / "metrics.jsonl").write_bytes(random.Random(1).randbytes(4096))
    before = _snapshot(tmp_path)
    code, out, err = cli("plot", tmp_path / "noise")
    assert code == 2 and out == "" and "Traceback" not in err and err.count("relax plot: error:") == 1
    assert f"{tmp_path / 'noise' / 'metrics.jsonl'}: line 1 is not" in err
    assert _snapshot(tmp_path) == before  # no rewards.png, nothing else written
