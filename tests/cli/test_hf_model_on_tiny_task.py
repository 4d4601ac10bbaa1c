"""A Hugging Face model (``--hf-checkpoint``) on a built-in task written for the tiny model: the task's
reward reads only the tiny 17-token vocabulary, so pre-flight calls it on the text of every token the
model can write and refuses the run (exit 2, before Ray) on the first it cannot score, naming the
flags and the fix (``relax.runtime.preflight.task_text``)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from relax.config.run import RunConfig
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.base import Prompt
from relax.runtime.preflight import PreflightError
from relax.runtime.preflight.task_text import check_task_reads_model_text

pytestmark = pytest.mark.real_preflight  # pre-flight is what these test (tests/cli/conftest.py)

FIX = "--prompt-data FILE --custom-rm-path module:function"
REWARD_MODULE = "relax_hf_tiny_task_reward"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("transformers")
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return build_tiny_random_checkpoint(tmp_path_factory.mktemp("hf_tiny_task") / "qwen2", "qwen2")


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """The user's directory: prompts with integer labels, and a reward that reads any text."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": "What is 1+2?", "label": 3}, {"prompt": "What is 4+4?", "label": 8}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{REWARD_MODULE}.py").write_text(textwrap.dedent("""
        def reward(prompt, completion, label, metadata):
            return float(str(label) in completion)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(REWARD_MODULE, None)


def _refused(cli, *argv) -> str:
    code, _, err = cli("train", *argv, "--dry-run")
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("relax train: error:")]
    return line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra", [(), ("--rollout-engine", "hf"), ("--eval-prompt-data", "data.jsonl"),
                                   ("--eval-interval", "1")],
                         ids=["default", "hf_engine", "eval_data", "eval_interval"])
def test_the_default_task_on_a_hf_model_is_refused_before_ray(cli, ws, checkpoint, extra):
    line = _refused(cli, "--hf-checkpoint", checkpoint, *extra)
    assert f"--hf-checkpoint {checkpoint} with --task addition: the task's reward scores every sample" in line
    assert "reads only the built-in tiny model's vocabulary, and this model can write token " in line
    assert "cannot encode" in line and FIX in line and "--task reasoning-gym:<dataset>" in line


@pytest.mark.timeout(120)
def test_prompt_data_scored_by_the_task_reward_is_refused_too(cli, ws, checkpoint):
    line = _refused(cli, "--hf-checkpoint", checkpoint, "--prompt-data", "data.jsonl", "--task", "addition-brevity",
                    "--reward-keys", "correct", "digits", "format", "length", "brevity")
    assert "with --task addition-brevity: the task's reward scores the --prompt-data samples" in line and FIX in line


@pytest.mark.timeout(120)
def test_the_suggested_fix_passes(cli, ws, checkpoint):
    code, _, err = cli("train", "--hf-checkpoint", checkpoint, "--prompt-data", "data.jsonl",
                       "--custom-rm-path", f"{REWARD_MODULE}:reward", "--eval-prompt-data", "data.jsonl", "--dry-run")
    assert code == 0, err


class _Vocabulary:
    """A tokenizer as the check sees it: ``vocab_size`` and ``decode`` of one id."""

    def __init__(self, texts):
        self.texts = list(texts)
        self.vocab_size = len(self.texts)

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


def _check(texts, **config):
    prompts = [("--task addition prompt 0", Prompt("<bos>1+2=", 3, {"seed": 0, "index": 0}))]
    check_task_reads_model_text(RunConfig(hf_checkpoint="/model", **config), _Vocabulary(texts), prompts)


def test_a_model_writing_only_tiny_text_passes_and_the_first_other_token_is_named():
    tiny = TinyTokenizer().vocab
    _check(tiny)  # every token the model can write is one the task's reward scores
    with pytest.raises(PreflightError, match=r"can write token 5 '\$', which it cannot score \(cannot encode '\$'"):
        _check([*tiny[:5], "$", "?"])


def test_every_engine_is_checked_and_rewards_that_read_any_text_pass():
    bad = ["<eos>", "$"]
    for engine in ("hf", "vllm"):  # both sample from the checkpoint's vocabulary
        with pytest.raises(PreflightError, match=r"--task addition: .*token 1 '\$'"):
            _check(bad, rollout_engine=engine)
    _check(bad, task="calculator")  # its reward reads the first digits of any text
    _check(bad, custom_rm_path="relax_no_such_module:reward")  # the user's reward: not the task's, not called here


def test_a_reward_model_serving_every_key_leaves_the_task_reward_uncalled():
    from relax.config.algorithm import AlgorithmConfig

    served = {"reward_model_path": "/rm", "reward_model_key": "rm"}
    _check(["$"], algorithm=AlgorithmConfig(reward_keys=("rm",)), **served)
    with pytest.raises(PreflightError, match=r"token 0 '\$'"):  # "correct" is still the task's to score
        _check(["$"], algorithm=AlgorithmConfig(reward_keys=("rm", "correct")), **served)
