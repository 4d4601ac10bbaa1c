"""Pre-flight of the reward services (``--reward-model-path``, ``--judge-model-path``,
``--judge-template``), before Ray starts: each directory is a Hugging Face checkpoint of the right
kind (a sequence-classification model with one logit; a causal LM whose tokenizer tells " yes" from
" no"), and the template reads and has its placeholders. The real call of each service, once its
Serve deployment is up and before the first step, is ``relax.runtime.reward_services``'s."""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, first_line, quiet
from relax.runtime.preflight.model import check_hf_dir


def _hf_config(path: str, flag: str):
    import transformers

    check_hf_dir(path, flag)
    with quiet():
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True)


def _tokenizer(path: str, flag: str):
    import transformers

    try:
        with quiet():
            return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to load it, in one line
        raise PreflightError(f"{flag} {path}: cannot load the tokenizer ({first_line(exc).splitlines()[0]})") from None


def check_reward_model(config: RunConfig) -> None:
    """``--reward-model-path``: a sequence-classification checkpoint with ``num_labels`` = 1."""
    path, flag = config.reward_model_path, "--reward-model-path"
    if not path:
        return
    hf = _hf_config(path, flag)
    architectures = list(getattr(hf, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise PreflightError(
            f"{flag} {path}: not a sequence-classification model (config.json architectures: "
            f"{', '.join(architectures) or 'none'}); a reward model is saved from "
            "AutoModelForSequenceClassification with num_labels=1"
        )
    if hf.num_labels != 1:
        raise PreflightError(
            f"{flag} {path}: the model has num_labels = {hf.num_labels} (config.json id2label); a reward model "
            "scores with one logit: num_labels=1"
        )
    _tokenizer(path, flag)


def check_judge(config: RunConfig) -> None:
    """``--judge-model-path`` (a causal LM) and ``--judge-template`` (a file with the placeholders)."""
    from relax.rollout.reward_scorers import answer_tokens, template_problem

    path, flag = config.judge_model_path, "--judge-model-path"
    if not path:
        return
    hf = _hf_config(path, flag)
    architectures = list(getattr(hf, "architectures", None) or [])
    if architectures and not any(a.endswith("ForCausalLM") for a in architectures):
        raise PreflightError(
            f"{flag} {path}: not a causal language model (config.json architectures: {', '.join(architectures)}); "
            "the judge generates its answer, so it is saved from AutoModelForCausalLM"
        )
    try:
        answer_tokens(_tokenizer(path, flag))
    except ValueError as exc:
        raise PreflightError(f"{flag} {path}: {exc}; the judge's score compares those two tokens") from None
    template = config.judge_template
    try:
        with open(template, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PreflightError(f"--judge-template {template}: cannot read it ({first_line(exc)})") from None
    problem = template_problem(text)
    if problem:
        raise PreflightError(f"--judge-template {template}: {problem}")


def check_reward_services(config: RunConfig) -> None:
    check_reward_model(config)
    check_judge(config)
