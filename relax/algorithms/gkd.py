"""GKD: generalized knowledge distillation on the student's own samples (Agarwal et al. 2023).

The student samples responses (on-policy, the paper's lambda = 1); at every sampled position the loss is
the generalized Jensen-Shannon divergence between the teacher's and the student's next-token
distributions,

    JSD_beta(P_teacher || Q_student) = beta KL(P || M) + (1 - beta) KL(Q || M),   M = beta P + (1 - beta) Q,

with ``beta = 0`` the forward KL(teacher || student) and ``beta = 1`` the reverse KL(student || teacher)
(the formula's scaled limits: ``relax.algorithms.numerics.distill_divergence``, the paper's convention).
Unlike on-policy distillation's advantage on the sampled token, this reads the whole distributions:
the teacher's top-k tokens and their log-probs (``--gkd-top-k``, 0 = the whole vocabulary) and the
student's log-probs of the same tokens, the rest of the mass as one bin. Gradients flow through the
student's distribution only; like the paper, none flows through the sampling. The rewards are computed
and logged, not trained on.
"""

from __future__ import annotations

import attrs
import torch

from relax.algorithms import numerics
from relax.algorithms.base import RLAlgorithm
from relax.algorithms.numerics.distill_divergence import generalized_jsd, reverse_kl, with_rest_bin
from relax.algorithms.types import AdvantageInputs, PolicyLossInputs, PolicyLossOutput
from relax.config.fields import NON_NEGATIVE_INT, UNIT_INTERVAL, flag


class GKD(RLAlgorithm):
    """Generalized JSD to a frozen teacher (``--teacher-checkpoint``) on the student's own samples."""

    name = "gkd"
    paper = ("Agarwal et al. 2023, On-Policy Distillation of Language Models: Learning from Self-Generated "
             "Mistakes (GKD, arXiv:2306.13649)")
    needs_teacher = True
    hyperparameters = ("reward_keys", "reward_weights", "loss_aggregation")

    @attrs.frozen(kw_only=True)
    class Config(RLAlgorithm.Config):
        """The shared hyper-parameters, the divergence's beta and how much of the teacher is kept."""

        gkd_beta: float = attrs.field(default=0.5, metadata=flag(
            "GKD's generalized JSD interpolation: 0 = forward KL(teacher || student), 0.5 = the symmetric "
            "JSD, 1 = reverse KL(student || teacher)", group="algorithm", check=UNIT_INTERVAL))
        gkd_top_k: int = attrs.field(default=0, metadata=flag(
            "GKD compares the distributions on the teacher's k most likely tokens plus one bin for the rest "
            "of the mass (a lower bound of the whole divergence; memory [N, T, k]); 0 = the whole vocabulary, "
            "exact", group="algorithm", check=NON_NEGATIVE_INT))

    def teacher_top_k(self) -> int:
        return self.config.gkd_top_k

    # ---- reward and advantage stages: logged, not trained on ----

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        c = self.config
        numerics.check_group_ids(group_ids, rewards.shape[0])
        return numerics.weighted_sum(numerics.reward_matrix(rewards, c.reward_keys), c.reward_weights).float()

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None) -> tuple[torch.Tensor, torch.Tensor]:
        """No advantage: the divergence is the loss. Zeros (the returns hold the reward on each token)."""
        returns = numerics.broadcast_to_tokens(inputs.rewards, inputs.response_mask)
        return torch.zeros_like(returns), returns

    # ---- policy stage ----

    def policy_loss(self, inputs: PolicyLossInputs) -> PolicyLossOutput:
        c = self.config
        if inputs.teacher_top_log_probs is None:
            raise ValueError(
                "GKD's loss reads the teacher's and the student's distributions, but PolicyLossInputs."
                "teacher_top_log_probs is None: run it with --teacher-checkpoint on a backend that gives "
                "distributions (--backend torch)"
            )
        mask = inputs.response_mask.to(torch.bool)
        teacher, student = inputs.teacher_top_log_probs.detach(), inputs.student_top_log_probs
        if c.gkd_top_k:  # the tokens outside the teacher's top-k as one bin
            teacher, student = with_rest_bin(teacher), with_rest_bin(student)
        # padded positions: a zero row is no distribution; give both sides the same one (divergence 0)
        keep = mask.unsqueeze(-1)
        teacher = torch.where(keep, teacher, torch.zeros((), dtype=teacher.dtype, device=teacher.device))
        student = torch.where(keep, student, teacher)

        def agg(x):
            return numerics.aggregate(x, mask, c.loss_aggregation, global_num_tokens=inputs.global_num_tokens,
                                      global_num_sequences=inputs.global_num_sequences,
                                      max_response_length=inputs.max_response_length)

        loss = agg(generalized_jsd(student, teacher, c.gkd_beta))
        metrics = {"gkd_loss": loss.detach(), "gkd_reverse_kl": agg(reverse_kl(student.detach(), teacher)).detach()}
        return PolicyLossOutput(loss=loss, metrics=metrics)
