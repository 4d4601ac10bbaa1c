"""Ready-made reward functions, each usable as ``--custom-rm-path`` and returning named components.

- ``relax.rewards.math:score`` — math-verify equivalence of the final answer with the label
  (``correct``, ``has_answer``);
- ``relax.rewards.code:score`` — the completion's Python block run against ``metadata["tests"]`` in a
  sandbox (``passed``, ``runs``); the sandbox is ``relax.rewards.sandbox``;
- ``relax.rewards.overlong`` — DAPO's soft over-long punishment (``soft_punishment``), in tokens;
- ``relax.rewards.shaping`` — format and length terms, and ``combine`` / ``renamed`` to build one
  function out of several;
- ``relax.rewards.overlong`` — DAPO's soft over-long punishment on the response's token count.

Submodules are imported on use, so that ``relax.rewards.code`` does not need math-verify.
"""
