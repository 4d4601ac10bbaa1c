"""The two model scorers behind the reward services (``--reward-model-path``, ``--judge-model-path``).

Both take a list of samples ``(prompt, completion, label)`` and return one float per sample, in order;
the Ray Serve deployment (``relax.runtime.cluster.reward_services``) calls them on each dynamically gathered
batch. They are plain torch + transformers, so a test can compare them with the model called directly.

- ``SequenceScorer``: a sequence-classification model with one logit; the score is that logit for
  ``prompt + completion`` (the text the policy saw and wrote).
- ``JudgeScorer``: a causal LM prompted with a template filled from the sample; the score is the
  probability of " yes" against " no" as the judge's next token, ``P(yes) / (P(yes) + P(no))`` =
  ``sigmoid(logit_yes - logit_no)``. When the tokenizer splits " yes" and " no" into several tokens
  (a byte tokenizer: " ", "y", ...), their common prefix is appended to the prompt and the first tokens
  where they differ are compared.

Batches are right-padded: with causal attention the real tokens of a row never see the padding, so a
batched score equals the score of the text alone up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The judge's template placeholders: the first two are required, {label} is optional.
REQUIRED_FIELDS = ("{prompt}", "{response}")
OPTIONAL_FIELDS = ("{label}",)
YES, NO = " yes", " no"

Sample = tuple[str, str, object]  # (prompt, completion, label)


def template_problem(template: str) -> str | None:
    """What is wrong with a judge template (None when it is usable)."""
    missing = [f for f in REQUIRED_FIELDS if f not in template]
    if missing:
        return (f"it has no {' or '.join(missing)} placeholder (a judge template needs "
                f"{' and '.join(REQUIRED_FIELDS)}; {OPTIONAL_FIELDS[0]} is optional)")
    return None


def fill_template(template: str, prompt: str, completion: str, label) -> str:
    """The judge prompt of one sample. Plain replacement, not ``str.format``: other braces in the
    template (a JSON example, say) stay as they are."""
    text = template.replace("{prompt}", prompt).replace("{response}", completion)
    return text.replace("{label}", "" if label is None else str(label))


def yes_probability(next_logits: torch.Tensor, yes_id: int, no_id: int) -> torch.Tensor:
    """``P(yes) / (P(yes) + P(no))`` from next-token logits ``[N, V]`` (float64 ``[N]``): the softmax
    over the whole vocabulary cancels, leaving ``sigmoid(logit_yes - logit_no)``."""
    logits = next_logits.double()
    return torch.sigmoid(logits[:, yes_id] - logits[:, no_id])


def answer_tokens(tokenizer) -> tuple[list[int], int, int]:
    """``(common prefix ids, yes id, no id)``: where the tokenizations of " yes" and " no" first differ."""
    yes = tokenizer.encode(YES, add_special_tokens=False)
    no = tokenizer.encode(NO, add_special_tokens=False)
    k = 0
    while k < min(len(yes), len(no)) and yes[k] == no[k]:
        k += 1
    if k == len(yes) or k == len(no):
        raise ValueError(f"the tokenizer encodes {YES!r} as {yes} and {NO!r} as {no}: no token tells them apart")
    return yes[:k], yes[k], no[k]


def _device(use_gpu: bool) -> torch.device:
    return torch.device("cuda") if use_gpu and torch.cuda.is_available() else torch.device("cpu")


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:  # padding only fills the batch; any id will do
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def _padded(tokenizer, texts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


class SequenceScorer:
    """A sequence-classification model with one logit (``num_labels`` = 1)."""

    def __init__(self, path: str, use_gpu: bool = False):
        from transformers import AutoModelForSequenceClassification

        self.device = _device(use_gpu)
        self.tokenizer = _load_tokenizer(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        if self.model.config.num_labels != 1:
            raise ValueError(f"{path} has num_labels = {self.model.config.num_labels}; a reward model has one")
        self.model.eval().to(self.device)

    def texts(self, samples: Sequence[Sample]) -> list[str]:
        return [prompt + completion for prompt, completion, _ in samples]

    @torch.no_grad()
    def score(self, samples: Sequence[Sample]) -> list[float]:
        ids, mask = _padded(self.tokenizer, self.texts(samples), self.device)
        logits = self.model(input_ids=ids, attention_mask=mask).logits  # [N, 1]: at each row's last real token
        return logits[:, 0].double().cpu().tolist()


class JudgeScorer:
    """A causal LM judge: ``P(" yes") / (P(" yes") + P(" no"))`` after the filled template."""

    def __init__(self, path: str, template: str, use_gpu: bool = False):
        from transformers import AutoModelForCausalLM

        problem = template_problem(template)
        if problem:
            raise ValueError(f"judge template: {problem}")
        self.template = template
        self.device = _device(use_gpu)
        self.tokenizer = _load_tokenizer(path)
        self.prefix, self.yes_id, self.no_id = answer_tokens(self.tokenizer)
        self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval().to(self.device)

    def prompt_ids(self, sample: Sample) -> list[int]:
        """The judge's input for one sample: the filled template, then the common prefix of the answers."""
        return self.tokenizer.encode(fill_template(self.template, *sample)) + self.prefix

    @torch.no_grad()
    def score(self, samples: Sequence[Sample]) -> list[float]:
        rows = [self.prompt_ids(s) for s in samples]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=self.device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.device)
        logits = self.model(input_ids=ids, attention_mask=mask).logits
        last = torch.tensor([len(r) - 1 for r in rows], device=self.device)
        next_logits = logits[torch.arange(len(rows), device=self.device), last]
        return yes_probability(next_logits, self.yes_id, self.no_id).cpu().tolist()
