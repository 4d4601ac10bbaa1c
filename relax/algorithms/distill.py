"""On-policy distillation: the student samples, a frozen teacher scores every sampled token, and the
student minimizes the per-token reverse KL(student || teacher) along its own samples.

Each valid response token t of a sample gets the advantage

    A_t = c * (log pi_teacher(y_t | y_<t) - log pi_old(y_t | y_<t)) + (1 - c) * A^reward_t

with ``c = --distill-coef`` in [0, 1] (default 1: pure distillation). The first term is the negative of
the sampled estimate of the token's reverse KL, with no discount and no sum over later tokens: each
token is scored only by its own log-ratio (the per-token form of on-policy distillation). ``pi_old``
is the student before this step's update (the old log-probs the loss's importance ratio starts
from), and the teacher scores the same temperature's distribution (the teacher pass,
``relax.runtime.step.reference_pass``).
``A^reward`` is GRPO's: the sample's group-standardized reward on every token (0 for a group of one).
The advantage then enters GRPO's clipped surrogate with its KL, entropy, aggregation and off-policy
terms unchanged.

Every sample carries the teacher's signal, so no prompt group is dropped for equal rewards
(``group_relative = False``) and a group of one sample is allowed.
"""

from __future__ import annotations

import attrs
import torch

from relax.algorithms.grpo import GRPO
from relax.algorithms.types import PolicyLossInputs, PolicyLossOutput
from relax.config.fields import Range, flag


class OnPolicyDistill(GRPO):
    """On-policy distillation: per-token advantage log pi_teacher - log pi_student (reverse KL), mixed with
    GRPO's reward advantage by --distill-coef."""

    name = "on-policy-distill"
    paper = ("Agarwal et al. 2023, On-Policy Distillation of Language Models (GKD, arXiv:2306.13649); "
             "Lu et al. 2025, On-Policy Distillation (Thinking Machines Lab)")
    needs_teacher = True
    group_relative = False

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        """GRPO's hyper-parameters and the mixing weight of the teacher's term."""

        distill_coef: float = attrs.field(default=1.0, metadata=flag(
            "weight c of the teacher's term in each token's advantage: c * (log pi_teacher - log pi_student) "
            "+ (1 - c) * the GRPO reward advantage; 1 = pure distillation, 0 = GRPO", group="algorithm",
            check=Range(ge=0, le=1)))

    def distill_advantages(self, inputs: PolicyLossInputs) -> torch.Tensor:
        """The mixed per-token advantage ``[N, T]`` (no gradient), 0 outside the response mask."""
        if inputs.teacher_log_probs is None:
            raise ValueError(
                f"{type(self).__name__} needs PolicyLossInputs.teacher_log_probs (the teacher role's log-probs), "
                "which is None: run it with --teacher-checkpoint through relax train"
            )
        c = self.config.distill_coef
        mask = inputs.response_mask.to(torch.bool)
        gap = inputs.teacher_log_probs.detach() - inputs.old_log_probs.detach()
        mixed = c * gap + (1.0 - c) * inputs.advantages.detach()
        return torch.where(mask, mixed, torch.zeros_like(mixed))

    def policy_loss(self, inputs: PolicyLossInputs) -> PolicyLossOutput:
        return super().policy_loss(attrs.evolve(inputs, advantages=self.distill_advantages(inputs)))
