"""A step's metrics, computed where the step runs: the actor's training metrics and the rollout's
reward, response and reward-service metrics.
"""
