"""Trackers (TensorBoard, W&B), the always-on health metrics and the ``--no-progress`` line.

Everything is read back with the tools' own readers: TensorBoard's ``EventAccumulator`` and the
records of the offline W&B run file (``wandb.proto``). No test touches the network: W&B runs
offline (``WANDB_MODE=offline`` is set for every test here).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import struct
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from relax.algorithms import AlgorithmConfig, get_algorithm
from relax.config.run import RunConfig
from relax.runtime.files import trackers as T
from relax.runtime.files.metrics_log import MetricsLog, progress_line
from relax.runtime.metrics.step_metrics import (
    COMPLETIONS_KEY,
    combined_reward_metrics,
    completion_records,
    response_metrics,
    response_stats,
    reward_metrics,
)

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="the tracking extra (tensorboard) is not installed"
)
needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None, reason="the tracking extra (wandb) is not installed"
)


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


# -- readers ---------------------------------------------------------------------------------------


def read_tensorboard(directory: Path) -> tuple[dict[str, dict[int, float]], dict, str]:
    """``({tag: {step: value}}, hparams, config text)`` of the event files in ``directory``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    hparams = {}
    for content in acc.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for key, value in data.session_start_info.hparams.items():
                hparams[key] = getattr(value, value.WhichOneof("kind"))
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    return scalars, hparams, text


def _wandb_records(path: Path):
    """The records of a ``.wandb`` file (LevelDB log format: 32 KiB blocks of checksummed chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding up to the next block
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 2):  # full, first
            pending = chunk
        else:  # middle, last
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_wandb(out: Path) -> tuple[dict[int, dict[str, float]], dict, object]:
    """``({step: {key: value}}, config, run record)`` of the one offline W&B run under ``out/wandb``."""
    files = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    history, config, run = {}, {}, None
    for record in _wandb_records(Path(files[0])):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = int(items.pop("_step"))
            history.setdefault(step, {}).update(
                {k: v for k, v in items.items() if not k.startswith("_")}
            )
    return history, config, run


def assert_trackers_match(out: Path, rows: list[dict], config: RunConfig, *, tensorboard=True, wandb=True):
    """Every numeric key of every metrics row is in each tracker, at the row's step, with its value."""
    keys = {k for r in rows for k in T.scalars_of(r)}
    if tensorboard:
        scalars, hparams, text = read_tensorboard(out)
        assert keys <= set(scalars), sorted(keys - set(scalars))
        for row in rows:
            for key, value in T.scalars_of(row).items():
                logged = scalars[key][row["step"]]
                # TensorBoard keeps float32: the same number, rounded once.
                assert logged == float(np.float32(value)) or (math.isnan(value) and math.isnan(logged)), key
        assert hparams["lr"] == pytest.approx(config.lr) and hparams["advantage_estimator"] == config.advantage_estimator
        assert f"reward_keys: {json.dumps(list(config.algorithm.reward_keys))}" in text
    if wandb:
        history, wb_config, run = read_wandb(out)
        assert sorted(history) == [r["step"] for r in rows]
        for row in rows:
            expected = T.scalars_of(row)
            got = {k: v for k, v in history[row["step"]].items() if k in keys}
            assert got.keys() == expected.keys()
            for key, value in expected.items():
                assert got[key] == value or (math.isnan(value) and math.isnan(got[key])), key
        assert wb_config["lr"] == config.lr and wb_config["reward_keys"] == list(config.algorithm.reward_keys)
        assert wb_config["num_rollout"] == config.num_rollout
        return run


# -- Trackers without a run -----------------------------------------------------------------------

ROWS = [
    {"step": 1, "reward/a/mean": 0.1234567891234, "actor/loss": -2.5, "rollout/groups_kept": 3, "time/step_s": 0.5},
    {"step": 2, "reward/a/mean": 0.75, "actor/loss": 1e-9, "rollout/groups_kept": 4, "time/step_s": 0.25,
     "train/skipped": 1},
    {"step": 3, "reward/a/mean": 1.0, "actor/loss": float("nan"), "rollout/groups_kept": 0, "time/step_s": 0.125},
]


def _config(out: Path, **kw) -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(reward_keys=("a",)), output_dir=str(out), run_name="unit", **kw)


@needs_tensorboard
@needs_wandb
def test_every_metric_reaches_both_trackers_with_the_config(tmp_path, capsys):
    config = _config(tmp_path, use_tensorboard=True, use_wandb=True, wandb_project="proj",
                     wandb_group="grp", wandb_run_name="my-run")
    trackers = T.Trackers(config, tmp_path)
    assert [t.name for t in trackers.trackers] == ["tensorboard", "wandb"]
    for row in ROWS:
        trackers.log(row)
    trackers.close()
    run = assert_trackers_match(tmp_path, ROWS, config)
    assert (run.project, run.run_group, run.display_name) == ("proj", "grp", "my-run")
    err = capsys.readouterr().err
    assert "W&B run offline (WANDB_MODE)" in err and "wandb sync" in err


@needs_tensorboard
def test_tensorboard_resume_hides_the_redone_steps(tmp_path):
    config = _config(tmp_path, use_tensorboard=True)
    first = T.Trackers(config, tmp_path)
    for row in ROWS:
        first.log(row)
    first.close()
    resumed = T.Trackers(config, tmp_path, resume_after_step=1)  # steps 2 and 3 are redone
    resumed.log({"step": 2, "reward/a/mean": 0.5})
    resumed.close()
    scalars, _, _ = read_tensorboard(tmp_path)
    assert scalars["reward/a/mean"] == {1: float(np.float32(ROWS[0]["reward/a/mean"])), 2: 0.5}


def test_no_tracker_by_default_and_a_failing_tracker_never_stops_the_run(tmp_path, capsys):
    trackers = T.Trackers(_config(tmp_path), tmp_path)
    assert trackers.trackers == []
    trackers.log(ROWS[0])  # nothing to do

    class Broken:
        name = "broken"
        closed = False

        def log(self, step, scalars, samples):
            raise OSError("disk full")

        def close(self):
            Broken.closed = True

    trackers.trackers.append(Broken())
    trackers.log(ROWS[0])
    trackers.log(ROWS[1])
    assert trackers.trackers == [] and Broken.closed
    assert capsys.readouterr().err.count("the broken tracker failed at step 1 (OSError('disk full')); it is switched off") == 1
    trackers.close()


def test_a_missing_package_names_the_flag_and_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(RuntimeError, match=r"--use-wandb needs the wandb package.*pip install -e '\.\[tracking\]'"):
        T.Trackers(_config(tmp_path, use_wandb=True), tmp_path)


def test_reachable_means_an_http_answer_within_the_timeout():
    import http.server
    import socket
    import threading
    import time

    # A closed port fails at once: the check does not wait for its timeout.
    assert not T._reachable("http://127.0.0.1:9", timeout=5)
    # A server that answers, even with an error status, is reachable.
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    assert T._reachable(f"http://127.0.0.1:{server.server_port}", timeout=5)
    server.server_close()
    # A port that accepts the connection but never answers (a captive proxy) is not, and the check
    # returns after its timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    start = time.monotonic()
    assert not T._reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    assert time.monotonic() - start < 3
    silent.close()


def test_wandb_goes_online_only_with_a_key_and_a_reachable_server(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert T.wandb_mode() == ("offline", "no W&B API key is configured")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(T, "_reachable", lambda url, timeout=T.REACHABLE_TIMEOUT_S: False)
    assert T.wandb_mode() == ("offline", "https://api.wandb.ai is not reachable")
    monkeypatch.setattr(T, "_reachable", lambda url, timeout=T.REACHABLE_TIMEOUT_S: True)
    assert T.wandb_mode()[0] == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert T.wandb_mode() == ("disabled", "WANDB_MODE")


# -- the flags on the command line ----------------------------------------------------------------


def _dry_run(capsys, *flags):
    from relax.cli.main import main

    try:
        code = main(["train", "--dry-run", *map(str, flags)])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_logging_flags_parse_and_warn_where_they_do_nothing(capsys, tmp_path):
    code, out, err = _dry_run(capsys, "--output-dir", tmp_path / "a", "--wandb-project", "p", "--wandb-group", "g",
                              "--log-interval", "5", "--log-completions", "2")
    assert code == 0, err
    assert "--wandb-project has no effect without --use-wandb" in err and "--wandb-group has no effect" in err
    assert "--log-interval has no effect without --no-progress" in err
    assert "log_completions: 2" in out and "wandb_project: p" in out
    code, out, err = _dry_run(capsys, "--output-dir", tmp_path / "b", "--use-wandb", "--wandb-project", "p",
                              "--no-progress", "--log-interval", "5")
    assert code == 0 and "no effect" not in err, err
    code, _, err = _dry_run(capsys, "--log-completions", "-1")
    assert code == 2 and "--log-completions" in err


def test_a_missing_tracker_package_is_refused_before_anything_starts(capsys, monkeypatch, tmp_path):
    from importlib import util

    find_spec = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    code, _, err = _dry_run(capsys, "--output-dir", tmp_path, "--use-tensorboard")
    assert code == 2
    assert "--use-tensorboard needs the tensorboard package: pip install -e '.[tracking]'" in err


# -- completions ---------------------------------------------------------------------------------


def test_completion_records_pick_the_first_samples_with_their_rewards():
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=("a", "b")), log_completions=3)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    keep = torch.tensor([False, False, True, True])  # the first group was dropped
    args = (["p0", "p0", "p1", "p1"], ["c0", "c1", "c2", "c3"], [1, 1, {"x": [2]}, object()], rewards, keep,
            torch.tensor([0.5, -0.5]))
    records = completion_records(config, *args, version=7)
    assert records == [
        {"policy_version": 7, "prompt": "p0", "completion": "c0", "label": 1, "rewards": {"a": 1.0, "b": 0.0},
         "normalized_reward": None},
        {"policy_version": 7, "prompt": "p0", "completion": "c1", "label": 1, "rewards": {"a": 0.0, "b": 1.0},
         "normalized_reward": None},
        {"policy_version": 7, "prompt": "p1", "completion": "c2", "label": {"x": [2]},
         "rewards": {"a": 1.0, "b": 1.0}, "normalized_reward": 0.5},
    ]
    config = attrs.evolve(config, log_completions=10)
    assert [r["normalized_reward"] for r in completion_records(config, *args, version=0)] == [None, None, 0.5, -0.5]
    assert completion_records(config, *args, version=0)[3]["label"].startswith("<object object")
    assert completion_records(attrs.evolve(config, log_completions=0), *args, version=0) == []
    if hasattr(config, "rollout_num_workers"):  # each of several workers gives its share
        assert len(completion_records(attrs.evolve(config, log_completions=3, rollout_num_workers=2), *args,
                                      version=0)) == 2


def _samples(step, count):
    return [{"policy_version": step - 1, "prompt": f"{step}+{i}=", "completion": f"{i}|x\n<eos>", "label": i,
             "rewards": {"a": float(i)}, "normalized_reward": None if i else 0.25} for i in range(count)]


def test_completions_go_to_the_file_and_both_trackers_and_stay_out_of_the_metrics(tmp_path):
    config = _config(tmp_path, use_tensorboard=importlib.util.find_spec("tensorboard") is not None,
                     use_wandb=importlib.util.find_spec("wandb") is not None, log_completions=2)
    metrics, trackers = MetricsLog(tmp_path / "metrics.jsonl"), T.Trackers(config, tmp_path)
    for row in ROWS:
        row = {**row, COMPLETIONS_KEY: _samples(row["step"], 3)}
        metrics.write(row)
        trackers.log(row)
    trackers.close()
    assert all(COMPLETIONS_KEY not in json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert lines == [{"step": step, "split": "train", **x} for step in (1, 2, 3) for x in _samples(step, 2)]
    resumed = T.Trackers(attrs.evolve(config, use_tensorboard=False, use_wandb=False), tmp_path, resume_after_step=1)
    resumed.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "completions.jsonl").read_text().splitlines()] == [1, 1]
    if config.use_tensorboard:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
        acc.Reload()
        texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("completions/text_summary")}
        assert sorted(texts) == [1, 2, 3]
        assert texts[2].splitlines() == [
            "| step | split | policy_version | prompt | completion | label | reward/a | normalized_reward |",
            "|---|---|---|---|---|---|---|---|",
            "| 2 | train | 1 | 2+0= | 0\\|x\\n<eos> | 0 | 0 | 0.25 |",
            "| 2 | train | 1 | 2+1= | 1\\|x\\n<eos> | 1 | 1 | None |",
        ]
    if config.use_wandb:
        history, _, _ = read_wandb(tmp_path)
        files = Path(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files"))[0])
        assert all(history[step]["completions/nrows"] == 2 for step in (1, 2, 3))
        table = json.loads((files / history[3]["completions/path"]).read_text())
        assert table["columns"] == ["step", "split", "policy_version", "prompt", "completion", "label", "reward/a",
                                    "normalized_reward"]
        assert table["data"] == [[3, "train", 2, "3+0=", "0|x\n<eos>", 0, 0.0, 0.25],
                                 [3, "train", 2, "3+1=", "1|x\n<eos>", 1, 1.0, None]]


# -- health metrics and the --no-progress line ----------------------------------------------------


def test_combined_reward_is_the_weighted_sum_of_the_components():
    rewards = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.5]], dtype=torch.float64)
    # weighted sums with (1, 2): 2, 2, 3, 2 -> mean 9 / 4
    assert combined_reward_metrics(rewards, (1.0, 2.0), ("a", "b")) == {"reward/combined/mean": 2.25}
    assert combined_reward_metrics(rewards[:, :1], (0.5,), ("a",)) == {"reward/combined/mean": 0.5}
    assert combined_reward_metrics(rewards, (1.0, 2.0), ("combined", "b")) == {}  # a component's own name
    algo = get_algorithm("gdpo")(AlgorithmConfig(reward_keys=("a", "b"), reward_weights=(1.0, 2.0),
                                                 n_samples_per_prompt=2))
    metrics = reward_metrics(algo, rewards, torch.tensor([0, 0, 1, 1]), ("a", "b"))
    assert metrics["reward/combined/mean"] == 2.25


def test_response_length_truncation_and_tokens_per_second():
    eos, pad = 2, 0
    ids = torch.tensor([[5, 2, pad, pad], [5, 6, 7, 8], [5, 6, 7, 2], [9, pad, pad, pad]])
    mask = ids != pad
    # row 1 hit the limit of 4 without <eos>: truncated; row 2 ended with <eos> at the limit: not
    assert response_stats(ids, mask, 4, eos) == {"response_len_max": 4, "truncated": 1}
    assert response_stats(ids[:, :2], mask[:, :2], 4, eos) == {"response_len_max": 2, "truncated": 0}
    other = {"samples": 4, "generated_tokens": 6, "response_len_max": 3, "truncated": 2,
             "times": {"time/rollout/generate_s": 2.0}}
    mine = {"samples": 4, "generated_tokens": 11, **response_stats(ids, mask, 4, eos),
            "times": {"time/rollout/generate_s": 0.5}}
    assert response_metrics([mine, other]) == {
        "rollout/response_len_max": 4, "rollout/truncated_frac": 3 / 8, "rollout/tokens_per_s": 17 / 2.0,
    }
    # --log-completions: the workers' samples travel along, in worker order
    mine["completions"], other["completions"] = [{"prompt": "w0"}], [{"prompt": "w1a"}, {"prompt": "w1b"}]
    merged = response_metrics([mine, other])[COMPLETIONS_KEY]
    assert [x["prompt"] for x in merged] == ["w0", "w1a", "w1b"]


def test_progress_line():
    row = {"step": 20, "reward/a/mean": 0.25, "reward/b/mean": 1.0, "reward/combined/mean": 2.25,
           "rollout/response_len": 5.5, "time/step_s": 0.125}
    assert progress_line(row, ("a", "b"), 450) == (
        "relax: step 20/450 | a 0.250 b 1.000 | combined 2.250 | response len 5.5 | 0.12 s/step"
    )
    assert progress_line({"step": 1}, ("a",), 2) == "relax: step 1/2 | a n/a | response len n/a | n/a s/step"


def test_metrics_log_keeps_the_row_as_given(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write(ROWS[0])
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == ROWS[0]


# -- end to end through `relax train` -------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_tensorboard
@needs_wandb
def test_relax_train_logs_to_both_trackers_with_completions_summaries_and_plot(ray_cluster, tmp_path, capsys):
    from relax.cli.main import build_parser, main, prepare_train_config

    out = tmp_path / "tracked"
    argv = ["train", "--num-rollout", "3", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--seed", "5", "--output-dir", str(out), "--no-progress", "--log-interval", "2",
            "--use-tensorboard", "--use-wandb", "--wandb-project", "relax-tests", "--wandb-group", "e2e",
            "--wandb-run-name", "tracked-run", "--log-completions", "3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the held-out evaluation before training
    assert "eval/correct/mean" in rows[0] and "eval/correct/mean" in rows[3] and "eval/pass@1" not in rows[1]
    parser, subparsers = build_parser()
    config, _ = prepare_train_config(argv, parser, subparsers["train"])
    keys, weights = config.algorithm.reward_keys, config.algorithm.reward_weights
    assert len(keys) > 1
    for row in rows[1:]:  # the always-on health metrics
        combined = sum(w * row[f"reward/{k}/mean"] for k, w in zip(keys, weights))
        assert row["reward/combined/mean"] == pytest.approx(combined, rel=1e-9)
        assert 1 <= row["rollout/response_len"] <= row["rollout/response_len_max"] <= config.rollout_max_response_len
        assert 0.0 <= row["rollout/truncated_frac"] <= 1.0 and row["rollout/tokens_per_s"] > 0
    run = assert_trackers_match(out, rows, config)
    assert (run.project, run.run_group, run.display_name) == ("relax-tests", "e2e", "tracked-run")
    # --no-progress --log-interval 2: steps 2 and 3 (the last), not step 1
    summaries = [line for line in err.splitlines() if line.startswith("relax: step ")]
    assert [line.split(" | ")[0] for line in summaries] == ["relax: step 2/3", "relax: step 3/3"]
    assert f"relax: reward curves: {out / 'rewards.png'}" in err
    # --log-completions 3: three samples per step, from the policy trained up to the previous step,
    # and three of each evaluation (before training and after the last step), from the policy evaluated
    everything = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    samples = [x for x in everything if x["split"] == "train"]
    assert [(x["step"], x["policy_version"]) for x in samples] == [(s, s - 1) for s in (1, 2, 3) for _ in range(3)]
    evaluated = [x for x in everything if x["split"] == "eval"]
    assert [(x["step"], x["policy_version"]) for x in evaluated] == [(s, s) for s in (0, 3) for _ in range(3)]
    for x in everything:
        assert set(x["rewards"]) == set(keys) and x["prompt"] and isinstance(x["completion"], str)
    history, _, _ = read_wandb(out)
    assert [history[s]["completions/nrows"] for s in (0, 1, 2, 3)] == [3, 3, 3, 6]
    files = Path(glob.glob(str(out / "wandb" / "offline-run-*" / "files"))[0])
    table = json.loads((files / history[3]["completions/path"]).read_text())
    assert table["columns"][1] == "split" and table["columns"][4] == "completion"
    assert [(row[1], row[4]) for row in table["data"]] == [
        (x["split"], x["completion"]) for x in samples[6:] + evaluated[3:]]
    assert (out / "rewards.png").read_bytes()[:4] == b"\x89PNG"
