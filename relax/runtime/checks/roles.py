"""Which roles a run needs and where each one runs: one pure function of the algorithm class and the
configuration. Nothing here looks at an algorithm's name; only capability attributes and settings.
"""

from __future__ import annotations

import attrs

ROLLOUT = "rollout"
ADVANTAGES = "advantages"
ACTOR = "actor"
CRITIC = "critic"
REFERENCE = "reference"
TEACHER = "teacher"

ROLE_ORDER = (ROLLOUT, REFERENCE, TEACHER, CRITIC, ADVANTAGES, ACTOR)  # the order a step visits them

# Where a role runs.
RAY_ACTOR = "ray_actor"  # its own Ray actor(s)
SERVE = "serve"  # a Ray Serve deployment
ON_ACTOR = "on_actor"  # inside the actor workers (shares their process group)


@attrs.frozen
class RoleLayout:
    """The roles of a run (in step order) and where each one is placed."""

    roles: tuple[str, ...]
    placement: dict[str, str] = attrs.field(hash=False)

    def __contains__(self, role: str) -> bool:
        return role in self.roles

    def describe(self) -> str:
        return ", ".join(f"{r} ({self.placement[r]})" for r in self.roles)


def derive_roles(algorithm_cls, config) -> RoleLayout:
    """The role layout for ``algorithm_cls`` (an ``RLAlgorithm`` subclass) under ``config``
    (a ``RunConfig``).

    - rollout, advantages and actor always exist;
    - critic exists only when the algorithm declares ``needs_critic``;
    - reference exists only when a KL term is on (``AlgorithmConfig.uses_reference``): it is a
      frozen copy of the initial policy held by each actor worker, which computes reference
      log-probs for its own shard (no extra process, no extra transfer);
    - teacher exists only when the algorithm declares ``needs_teacher``: the frozen
      ``--teacher-checkpoint`` model, held by each actor worker like the reference, which scores its
      own shard's sampled tokens (``relax.runtime.step.reference_pass``);
    - advantages run in a Ray Serve deployment, or inside the actor workers with their
      data-parallel process group when ``advantages_on_actor`` is set.
    """
    roles = [ROLLOUT, ADVANTAGES, ACTOR]
    placement = {
        ROLLOUT: RAY_ACTOR,
        ADVANTAGES: ON_ACTOR if config.advantages_on_actor else SERVE,
        ACTOR: RAY_ACTOR,
    }
    if algorithm_cls.needs_critic:
        roles.append(CRITIC)
        placement[CRITIC] = RAY_ACTOR
    if config.algorithm.uses_reference:
        roles.append(REFERENCE)
        placement[REFERENCE] = ON_ACTOR
    if algorithm_cls.needs_teacher:
        roles.append(TEACHER)
        placement[TEACHER] = ON_ACTOR
    ordered = tuple(r for r in ROLE_ORDER if r in roles)
    return RoleLayout(roles=ordered, placement=placement)
