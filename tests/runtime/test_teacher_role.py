"""The teacher role (issue: on-policy distillation): derived from the ``needs_teacher`` capability
alone, ``--teacher-checkpoint`` required exactly then, the forms a teacher checkpoint takes, the
tokenizer check before Ray, the teacher pass (padded and packed micro-batches) and the step it drives,
for the built-in method and a user's method loaded by dotted path."""

from __future__ import annotations

import sys
import textwrap

import attrs
import pytest
import torch

from relax.algorithms import AlgorithmConfig, load_algorithm
from relax.algorithms.distill import OnPolicyDistill
from relax.config.run import RunConfig
from relax.models.batch import TokenBatch
from relax.models.teacher import HF, RUN, TINY, TeacherCheckpointError, load_teacher_model, resolve_teacher
from relax.models.tiny.calculator import CHECKPOINT as CALCULATOR_CHECKPOINT
from relax.models.tiny.weights import CHECKPOINT, load_warmup_model
from relax.recipes.single_process import train_single_process
from relax.rollout.tasks import get_task
from relax.runtime.checks import roles as R
from relax.runtime.checks.validation import ConfigError, validate
from relax.runtime.preflight.common import PreflightError
from relax.runtime.preflight.teacher import check_teacher
from relax.runtime.step.reference_pass import TeacherPass, reference_log_probs

USER_MODULE = "relax_teacher_test_user_method"
USER_SOURCE = textwrap.dedent('''
    """A user's distillation variant: it declares needs_teacher and nothing else about the role."""
    import attrs
    import torch

    from relax.algorithms.grpo import GRPO

    SEEN = []


    class HalfDistill(GRPO):
        needs_teacher = True
        group_relative = False

        def policy_loss(self, inputs):
            assert inputs.teacher_log_probs is not None, "the runtime gave no teacher log-probs"
            SEEN.append(inputs.teacher_log_probs.shape)
            gap = 0.5 * (inputs.teacher_log_probs - inputs.old_log_probs) * inputs.response_mask
            return super().policy_loss(attrs.evolve(inputs, advantages=gap))
''')


@pytest.fixture(scope="module")
def user_method(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_method")
    (root / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    sys.path.insert(0, str(root))
    try:
        yield f"{USER_MODULE}:HalfDistill"
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(USER_MODULE, None)


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory):
    """A tiny teacher of the addition task that is not the student: the warm-up with a sharper output."""
    state = torch.load(CHECKPOINT, weights_only=True)
    state["model"] = {k: v * 2.0 if k == "ln_f.weight" else v for k, v in state["model"].items()}
    path = tmp_path_factory.mktemp("teacher") / "sharp.pt"
    torch.save(state, path)
    return path


def _config(spec: str = "on-policy-distill", teacher=CHECKPOINT, config_cls=OnPolicyDistill.Config, **kw) -> RunConfig:
    algorithm = config_cls(reward_keys=get_task("addition").reward_keys, n_samples_per_prompt=4,
                           **kw.pop("algorithm", {}))
    settings = {"rollout_batch_size": 4, "num_steps_per_rollout": 2, "num_rollout": 2, "seed": 5, "progress": False}
    return RunConfig(advantage_estimator=spec, algorithm=algorithm,
                     teacher_checkpoint=None if teacher is None else str(teacher), **{**settings, **kw})


# -- the role and the flag ------------------------------------------------------------------------


def test_the_teacher_role_comes_from_the_capability_alone(user_method):
    for spec in ("on-policy-distill", user_method):
        layout = R.derive_roles(load_algorithm(spec), _config(spec))
        assert R.TEACHER in layout and layout.placement[R.TEACHER] == R.ON_ACTOR
        assert layout.roles.index(R.TEACHER) < layout.roles.index(R.ACTOR)
    assert R.TEACHER not in R.derive_roles(load_algorithm("grpo"), _config("grpo", teacher=None))


def test_teacher_checkpoint_is_required_by_a_teacher_method_and_refused_otherwise(user_method):
    with pytest.raises(ConfigError, match=r"HalfDistill .*needs_teacher.*pass --teacher-checkpoint"):
        validate(_config(user_method, teacher=None), load_algorithm(user_method))
    with pytest.raises(ConfigError, match=r"--teacher-checkpoint .*would do nothing: GRPO"):
        validate(_config("grpo", config_cls=AlgorithmConfig), load_algorithm("grpo"))
    validate(_config(user_method, config_cls=AlgorithmConfig), load_algorithm(user_method))  # no error


# -- the forms of a teacher checkpoint ------------------------------------------------------------


def _run_checkpoint(root, weights) -> None:
    """A relax run directory with one checkpoint (the layout relax train writes)."""
    step = root / "checkpoints" / "step_000004"
    step.mkdir(parents=True)
    torch.save({"step": 4, "actor": {"backend": {"model": weights}}, "rollout": {}, "critic": None,
                "advantage_estimator": "grpo"}, step / "state.pt")


def test_the_forms_a_teacher_checkpoint_takes(tmp_path):
    assert resolve_teacher(str(CHECKPOINT), student_is_hf=False).kind == TINY
    weights = {k: v + 0.25 for k, v in load_warmup_model().state_dict().items()}
    _run_checkpoint(tmp_path / "run", weights)
    step = tmp_path / "run" / "checkpoints" / "step_000004"
    for path in (tmp_path / "run", step, step / "state.pt"):
        source = resolve_teacher(str(path), student_is_hf=False)
        assert source.kind == RUN and source.path == step / "state.pt"
    loaded = load_teacher_model(_config(teacher=tmp_path / "run"), load_warmup_model(), device="cpu")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in weights.items())
    assert not any(p.requires_grad for p in loaded.parameters()) and not loaded.training
    (step / "hf").mkdir()
    (step / "hf" / "config.json").write_text("{}")  # an HF run's checkpoint: its export is the teacher
    assert resolve_teacher(str(tmp_path / "run"), student_is_hf=True) == resolve_teacher(str(step / "hf"), student_is_hf=True)
    assert resolve_teacher(str(step / "hf"), student_is_hf=True).kind == HF


def test_a_teacher_the_student_cannot_use_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(TeacherCheckpointError, match="--teacher-checkpoint .*does not exist"):
        resolve_teacher(str(tmp_path / "missing"), student_is_hf=False)
    with pytest.raises(TeacherCheckpointError, match="--teacher-checkpoint .*built-in tiny model.*--hf-checkpoint"):
        resolve_teacher(str(CHECKPOINT), student_is_hf=True)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    with pytest.raises(TeacherCheckpointError, match="--teacher-checkpoint .*Hugging Face model.*tiny"):
        resolve_teacher(str(tmp_path / "hf"), student_is_hf=False)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PreflightError, match="--teacher-checkpoint .*junk.pt"):
        check_teacher(_config(teacher=tmp_path / "junk.pt"), get_task("addition").make_tokenizer())
    weights = load_warmup_model().state_dict()
    weights["blocks.0.ln1.weight"] = torch.ones(3)  # a checkpoint of another architecture
    _run_checkpoint(tmp_path / "other", weights)
    with pytest.raises(PreflightError, match="--teacher-checkpoint .*state.pt: its weights do not fit the tiny model"):
        check_teacher(_config(teacher=tmp_path / "other"), get_task("addition").make_tokenizer())


def test_a_teacher_with_another_tokenizer_is_refused_before_ray_naming_both():
    config = _config(teacher=CALCULATOR_CHECKPOINT)
    with pytest.raises(PreflightError, match=r"--teacher-checkpoint .*calculator.pt has a 21-token vocabulary.*--task "
                                             r"addition\) tokenizer has 17"):
        check_teacher(config, get_task("addition").make_tokenizer())
    check_teacher(_config(), get_task("addition").make_tokenizer())  # the task's own model: accepted


# -- the teacher pass ------------------------------------------------------------------------------


def _batch(n=6, prompt=4, response=6, vocab=17, seed=0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, prompt + 1, (n,), generator=g)
    response_len = torch.randint(1, response + 1, (n,), generator=g)
    prompt_mask = torch.arange(prompt)[None, :] >= (prompt - prompt_len)[:, None]
    response_mask = torch.arange(response)[None, :] < response_len[:, None]
    return TokenBatch(prompt_ids=torch.randint(3, vocab, (n, prompt), generator=g) * prompt_mask,
                      prompt_mask=prompt_mask,
                      response_ids=torch.randint(3, vocab, (n, response), generator=g) * response_mask,
                      response_mask=response_mask)


class _ReplicatedBackend:
    forward_is_collective = False


def test_teacher_pass_padded_and_packed_micro_batches_give_the_teachers_log_probs(sharp_teacher):
    batch = _batch()
    teacher = TeacherPass(_config(teacher=sharp_teacher), load_warmup_model(), device="cpu")
    whole = teacher.log_probs(batch, _ReplicatedBackend())
    # independent: the teacher's own forward on each row alone, log-softmax at the sampling temperature 1
    for i in range(len(batch)):
        row = batch.select(slice(i, i + 1))
        with torch.no_grad():
            logits = teacher.model(row.input_ids, attention_mask=row.attention_mask, position_ids=row.position_ids)
        p = row.prompt_width
        expected = torch.log_softmax(logits[0, p - 1:-1].double(), -1).gather(-1, row.response_ids[0, :, None])[:, 0]
        torch.testing.assert_close(whole[i].double(), expected * row.response_mask[0], rtol=1e-5, atol=1e-5)
    for changes in ({"micro_batch_size": 2}, {"max_tokens_per_micro_batch": 9}):
        config = _config(teacher=sharp_teacher, **changes)
        torch.testing.assert_close(TeacherPass(config, load_warmup_model(), device="cpu").log_probs(
            batch, _ReplicatedBackend()), whole, rtol=1e-5, atol=1e-6)
    # the student's own reference pass gives other numbers: the teacher is not the policy
    assert not torch.allclose(reference_log_probs(load_warmup_model(), batch, _config()), whole, atol=1e-3)


# -- the step it drives (the single-process recipe: relax train's synchronous step) -------------


def _moved(weights) -> bool:
    initial = load_warmup_model().state_dict()
    return any(not torch.equal(initial[k], v) for k, v in weights.items())


def _train(out, **kw):
    """``relax train --in-process`` from Python; the training steps' rows and the final weights."""
    result = train_single_process(_config(output_dir=str(out), evaluate=False, **kw))
    return [row for row in result.rows if row["step"] > 0], result.weights


def test_distill_coef_and_the_teacher_drive_the_update(tmp_path):
    # the initial policy as its own teacher: every token's distillation advantage is 0, nothing moves
    rows, weights = _train(tmp_path / "still")
    assert [row["distill/reverse_kl"] for row in rows] == [0.0, 0.0]
    assert all(row["time/actor/teacher_s"] > 0 for row in rows)
    assert not _moved(weights)
    # --distill-coef 0.5 mixes in the reward advantage: the policy moves away from the teacher
    rows, weights = _train(tmp_path / "mixed", algorithm={"distill_coef": 0.5})
    assert _moved(weights) and rows[-1]["distill/reverse_kl"] > 0


def test_a_users_method_by_dotted_path_gets_the_teacher(user_method, sharp_teacher, tmp_path):
    module = pytest.importorskip(USER_MODULE)
    module.SEEN.clear()
    rows, weights = _train(tmp_path, spec=user_method, teacher=sharp_teacher, config_cls=AlgorithmConfig,
                           num_rollout=1)
    assert module.SEEN and all(len(shape) == 2 for shape in module.SEEN)
    assert rows[0]["distill/reverse_kl"] > 0 and _moved(weights)


def test_the_teacher_pass_keeps_the_batch_device(sharp_teacher):
    config = attrs.evolve(_config(teacher=sharp_teacher))
    shard: dict = {}
    TeacherPass(config, load_warmup_model(), device="cpu").add_to(shard, _batch(), _ReplicatedBackend())
    assert shard["teacher_log_probs"].device.type == "cpu" and shard["time/actor/teacher_s"] >= 0


def test_reverse_kl_share_is_the_token_mean_of_student_minus_teacher():
    from relax.runtime.metrics.actor_metrics import combine_actor_metrics, logged_name, policy_health_shares

    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    old, teacher = -torch.rand((3, 4), generator=g) * 2, -torch.rand((3, 4), generator=g) * 2
    shard = {"old_log_probs": old, "old_entropy": torch.zeros(3, 4), "teacher_log_probs": teacher}
    tokens = int(mask.sum())
    # two data-parallel ranks' shares of one mini-batch add up to its token mean
    shares = [policy_health_shares(shard, rows, mask[rows], tokens, "k1") for rows in (slice(0, 2), slice(2, 3))]
    combined = combine_actor_metrics([[s] for s in shares])["teacher_reverse_kl"]
    expected = sum(float(old[i, t]) - float(teacher[i, t]) for i in range(3) for t in range(4) if mask[i, t]) / tokens
    assert combined == pytest.approx(expected, rel=1e-6)
    assert logged_name("teacher_reverse_kl") == "distill/reverse_kl"
