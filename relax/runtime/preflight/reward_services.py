"""Pre-flight of the reward services (``--reward-model-path``, ``--judge-model-path``,
``--judge-template``), before Ray starts: each directory is a Hugging Face checkpoint of the right
kind (a sequence-classification model with one logit; a causal LM whose tokenizer tells " yes" from
" no"), whose weight files are whole and whose vocabulary covers its own tokenizer (the policy's checks,
``relax.models.hf.checks``), and the template reads, has its placeholders and no misspelt one. The real call of each service, once its
Serve deployment is up and before the first step, is ``relax.runtime.cluster.reward_services``'s."""

from __future__ import annotations

import difflib
import re
import types
from pathlib import Path

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


def _check_weights_and_vocabulary(hf, tokenizer, path: str, flag: str) -> None:
    """The service's own tokenizer re-tokenizes every text it scores: the embedding must cover it
    (else an ``IndexError`` in a replica at the first scored batch), and the weight files must be whole
    (else one relayed traceback per replica, none naming the file)."""
    from relax.models.hf.checks import vocabulary_problem, weights_problem

    problem = (vocabulary_problem(hf, types.SimpleNamespace(vocab_size=len(tokenizer)), flag, path)
               or weights_problem(Path(path), None, flag, path))
    if problem:
        raise PreflightError(problem)


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def misspelt_placeholder(text: str) -> str | None:
    """A ``{name}`` in the template that is close to a placeholder but is none (``{lable}``): plain
    replacement would leave it in every judge prompt. Other ``{...}`` text (a JSON example, ``{x}``
    in a formula) is the template's own."""
    from relax.rollout.reward_scorers import OPTIONAL_FIELDS, REQUIRED_FIELDS

    known = [f.strip("{}") for f in (*REQUIRED_FIELDS, *OPTIONAL_FIELDS)]
    for name in _PLACEHOLDER.findall(text):
        if name not in known and (close := difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)):
            return (f"{{{name}}} is not a placeholder (did you mean {{{close[0]}}}?); the placeholders are "
                    f"{', '.join('{' + k + '}' for k in known)}")
    return None


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
    _check_weights_and_vocabulary(hf, _tokenizer(path, flag), path, flag)


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
    tokenizer = _tokenizer(path, flag)
    _check_weights_and_vocabulary(hf, tokenizer, path, flag)
    try:
        answer_tokens(tokenizer)
    except ValueError as exc:
        raise PreflightError(f"{flag} {path}: {exc}; the judge's score compares those two tokens") from None
    template = config.judge_template
    try:
        with open(template, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PreflightError(f"--judge-template {template}: cannot read it ({first_line(exc)})") from None
    problem = template_problem(text) or misspelt_placeholder(text)
    if problem:
        raise PreflightError(f"--judge-template {template}: {problem}")


def check_service_gpus(config: RunConfig) -> None:
    """Explicit ``--reward-model-gpus`` / ``--judge-gpus`` beyond the GPUs of this machine, for a run
    that starts its own Ray (a joined cluster is checked once the run is on it: ``resource_fit``)."""
    from relax.runtime.checks.resource_fit import gpu_problem

    if config.ray_address or not any((config.reward_model_path and config.reward_model_gpus,
                                      config.judge_model_path and config.judge_gpus)):
        return
    import torch

    problem = gpu_problem(config, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if problem:
        raise PreflightError(problem)


def check_reward_services(config: RunConfig) -> None:
    check_reward_model(config)
    check_judge(config)
    check_service_gpus(config)
