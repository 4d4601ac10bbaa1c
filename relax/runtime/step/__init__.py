"""One training step's work, role by role, as plain Python cores that Ray or one process drives: the
rollout (generation, rewards, evaluation slices), the advantages, the actor and the critic, with the
step's schedule and the losses.
"""
