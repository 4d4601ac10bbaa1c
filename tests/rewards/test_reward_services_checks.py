"""Bad reward-service inputs are refused by ``relax train`` before Ray starts (exit 2, one error line
naming the flag): a missing directory, a model of the wrong kind or with several labels, a judge
template without its placeholders, a service component that is not a reward key or that the reward
function fills too."""

from __future__ import annotations

import textwrap

import pytest

from relax.models.hf.tiny_random import build_tiny_random_checkpoint, build_tiny_reward_model

REWARDS = textwrap.dedent('''
    def digits(prompt, completion, label, metadata):
        return {"digits": float(sum(c.isdigit() for c in completion))}

    def two(prompt, completion, label, metadata):
        return {"digits": float(sum(c.isdigit() for c in completion)), "len": float(len(completion))}

    def takes_rm(prompt, completion, label, metadata):
        return {"digits": 0.0, "rm": 1.0}
''')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_service_checks")
    (root / "service_check_rewards.py").write_text(REWARDS)
    rm = build_tiny_reward_model(root / "rm", hidden=32, layers=1)
    two = build_tiny_reward_model(root / "two_labels", hidden=32, layers=1)
    import json

    config = json.loads((two / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "bad", "1": "good"}, {"bad": 0, "good": 1}
    (two / "config.json").write_text(json.dumps(config))
    causal = build_tiny_random_checkpoint(root / "causal", "qwen2", hidden=32, layers=1)
    import shutil

    truncated = shutil.copytree(rm, root / "truncated")  # a copy cut short
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    small = shutil.copytree(rm, root / "small_vocab")  # an embedding smaller than its tokenizer
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 200
    (small / "config.json").write_text(json.dumps(config))
    (root / "no_response.txt").write_text("Is this right? {prompt}")
    (root / "misspelt.txt").write_text('{prompt} {response} Reference: {lable}. Answer as {"ok": true}, {x}?')
    (root / "good.txt").write_text("{prompt} {response} right?")
    return root, rm, two, causal


def _main(argv) -> int:
    from relax.cli.main import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse's error(): status 2
        return exc.code


def _argv(root, *extra):
    return ["train", "--dry-run", "--advantage-estimator", "gdpo", "--custom-rm-path", "service_check_rewards:digits",
            "--output-dir", str(root / "out"), *extra]


CASES = [
    ("missing", lambda r, rm, two, c: ["--reward-model-path", str(r / "nowhere"), "--reward-keys", "digits", "rm"],
     "--reward-model-path .*nowhere.* does not exist"),
    ("causal_as_rm", lambda r, rm, two, c: ["--reward-model-path", str(c), "--reward-keys", "digits", "rm"],
     "--reward-model-path .*: not a sequence-classification model .*Qwen2ForCausalLM"),
    ("two_labels", lambda r, rm, two, c: ["--reward-model-path", str(two), "--reward-keys", "digits", "rm"],
     "--reward-model-path .*: the model has num_labels = 2"),
    ("key_not_a_reward_key", lambda r, rm, two, c: ["--reward-model-path", str(rm), "--reward-keys", "digits", "len"],
     r"--reward-model-key rm is not one of --reward-keys \(digits len\)"),
    ("collision", lambda r, rm, two, c: ["--reward-model-path", str(rm), "--reward-keys", "digits", "rm",
                                         "--custom-rm-path", "service_check_rewards:takes_rm"],
     "returns the component 'rm', which the reward model service .* fills"),
    ("judge_without_template", lambda r, rm, two, c: ["--judge-model-path", str(c), "--reward-keys", "digits", "judge"],
     "--judge-model-path .* needs --judge-template"),
    ("template_placeholder", lambda r, rm, two, c: ["--judge-model-path", str(c), "--judge-template",
                                                    str(r / "no_response.txt"), "--reward-keys", "digits", "judge"],
     r"--judge-template .*no_response.txt: it has no \{response\} placeholder"),
    ("rm_truncated", lambda r, rm, two, c: ["--reward-model-path", str(r / "truncated"), "--reward-keys", "digits", "rm"],
     r"--reward-model-path .*truncated: model.safetensors is (truncated|not a readable safetensors file)"),
    ("rm_vocabulary", lambda r, rm, two, c: ["--reward-model-path", str(r / "small_vocab"), "--reward-keys", "digits",
                                             "rm"],
     "--reward-model-path .*small_vocab: config.json has vocab_size 200 but the tokenizer has 262 tokens"),
    ("template_misspelt", lambda r, rm, two, c: ["--judge-model-path", str(c), "--judge-template",
                                                 str(r / "misspelt.txt"), "--reward-keys", "digits", "judge"],
     r"--judge-template .*misspelt.txt: \{lable\} is not a placeholder \(did you mean \{label\}\?\)"),
    ("rm_gpus_beyond_the_machine", lambda r, rm, two, c: ["--reward-model-path", str(rm), "--reward-model-gpus", "64",
                                                          "--reward-keys", "digits", "rm"],
     r"the reward services ask for 64 GPU\(s\) \(--reward-model-replicas 1 x --reward-model-cpus 1 / "
     r"--reward-model-gpus 64\) but this machine has \d+ GPU\(s\)"),
    ("judge_is_rm", lambda r, rm, two, c: ["--judge-model-path", str(rm), "--judge-template", str(r / "good.txt"),
                                           "--reward-keys", "digits", "judge"],
     "--judge-model-path .*: not a causal language model"),
]


@pytest.mark.parametrize("name,extra,message", CASES, ids=[c[0] for c in CASES])
def test_bad_reward_service_input_is_refused_before_ray_starts(files, name, extra, message, monkeypatch, capsys):
    import re

    root = files[0]
    monkeypatch.syspath_prepend(str(root))

    def must_not_start(config):
        raise AssertionError("a bad reward-service input got past pre-flight")

    monkeypatch.setattr("relax.cli.main.run_train", must_not_start)
    code = _main(_argv(root, *extra(*files)))
    err = capsys.readouterr().err
    assert code == 2 and err.count("relax train: error:") == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


def test_good_reward_service_inputs_pass_the_dry_run(files, monkeypatch, capsys):
    root, rm, _, causal = files
    monkeypatch.syspath_prepend(str(root))
    argv = _argv(root, "--reward-model-path", str(rm), "--judge-model-path", str(causal), "--judge-template",
                 str(root / "good.txt"), "--reward-keys", "digits", "rm", "judge")
    assert _main(argv) == 0, capsys.readouterr().err


def test_service_flags_without_their_service_warn(files, monkeypatch, capsys):
    root = files[0]
    monkeypatch.syspath_prepend(str(root))
    argv = _argv(root, "--reward-keys", "digits", "len", "--custom-rm-path", "service_check_rewards:two",
                 "--reward-model-replicas", "2", "--judge-key", "verdict")
    code = _main(argv)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "--reward-model-replicas has no effect without --reward-model-path" in err, err
    assert "--judge-key has no effect without --judge-model-path" in err, err


def test_the_tiny_reward_model_covers_its_tokenizer_and_the_builder_help_is_whole(files, capsys):
    # build_tiny_reward_model wrote vocab_size 261 for the 262 tokens its directory reloads with (qwen2
    # adds <|endoftext|> once config.json is there): the vocabulary check above would refuse it.
    import json

    from transformers import AutoTokenizer

    from relax.models.hf.tiny_random import main

    rm = files[1]
    assert json.loads((rm / "config.json").read_text())["vocab_size"] == len(AutoTokenizer.from_pretrained(str(rm)))
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "without downloading anything." in " ".join(capsys.readouterr().out.split())
