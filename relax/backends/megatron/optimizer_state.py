"""The optimizer-side state of ``MegatronBackend``: the tensors the optimizer steps (the float32
masters with ``--bf16``), Adam's moments, and the checkpoint (``state_dict``/``load_state_dict``) in
the model family's naming, independent of the tensor/pipeline/data-parallel layout.

A mixin: it reads the backend's module (``gpt``), ``optimizer``, ``family`` and the weight
conversions (``export_weights``, ``load_weights``, ``_gather``, ``_shard_into``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.backends.megatron.layer_specs import canonical_name
from relax.backends.megatron.model import local_tensors

CHECKPOINT_FORMAT = "relax-megatron-v1"


class OptimizerState:
    """The optimizer's tensors and the backend's checkpoint (see the module's docstring)."""


    def _torch_optimizers(self) -> list:
        inner = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [o.optimizer for o in inner]

    def _master_tensors(self) -> dict[str, torch.Tensor]:
        """Every local tensor of the model (``local_tensors`` names, shared tensors under each of
        their names), as the optimizer steps it: a parameter's float32 master when it has one."""
        params = {canonical_name(name): p for name, p in self.gpt.named_parameters(remove_duplicate=False)}
        return {name: getattr(params.get(name), "main_param", tensor)
                for name, tensor in local_tensors(self.gpt).items()}

    def _master_params(self) -> dict[str, torch.Tensor]:
        """The tensors the optimizer steps, by local Megatron name: the parameters themselves in
        float32, their float32 master copies (``param.main_param``, set by Megatron's mixed-precision
        optimizer) with ``--bf16``."""
        return {canonical_name(name): getattr(p, "main_param", p) for name, p in self.gpt.named_parameters()}

    def _adam_state(self, key: str) -> dict[str, torch.Tensor]:
        """One Adam state tensor per parameter, by local Megatron name (zeros before the first step);
        float32 also with ``--bf16``, where Adam's state belongs to the master copies."""
        states = {}
        for opt in self._torch_optimizers():
            states.update({id(p): s for p, s in opt.state.items()})
        out = {}
        for name, param in self._master_params().items():
            state = states.get(id(param), {})
            out[name] = state[key] if key in state else torch.zeros_like(param)
        return out

    def state_dict(self) -> dict:
        """Model weights (``export_weights``: float32, with ``--bf16`` the masters, from which the
        bfloat16 parameters are their rounding) and Adam moments in the family's naming, independent
        of tp/pp/dp layout.

        A collective over the model-parallel group: every rank must call it.
        """
        adam_steps = [
            float(s["step"]) for opt in self._torch_optimizers() for s in opt.state.values() if "step" in s
        ]
        return {
            "format": CHECKPOINT_FORMAT,
            "model_config": self.family.describe(),
            "model": self.export_weights(),
            "exp_avg": self._gather(self._adam_state("exp_avg")),
            "exp_avg_sq": self._gather(self._adam_state("exp_avg_sq")),
            "adam_step": max(adam_steps, default=0.0),
            "steps": self.steps,
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"not a Megatron-backend checkpoint (format {state.get('format')!r}, expected "
                f"{CHECKPOINT_FORMAT!r}); load it with the backend that wrote it"
            )
        if state["model_config"] != self.family.describe():
            raise ValueError(f"checkpoint model {state['model_config']} != this model {self.family.describe()}")
        # "model" holds the float32 weights the optimizer steps (with --bf16 its masters); a --bf16
        # checkpoint written before the export took the masters held them beside bfloat16 "model"
        # weights, as "master".
        self.load_weights(state.get("master", state["model"]))
        masters = self._master_params()  # the tensors the optimizer steps (the parameters in float32)
        name_of = {id(m): name for name, m in masters.items()}
        for key in ("exp_avg", "exp_avg_sq"):
            targets = {name: torch.zeros_like(m) for name, m in masters.items()}
            self._shard_into(targets, state[key])
            for opt in self._torch_optimizers():
                for group in opt.param_groups:
                    for p in group["params"]:
                        slot = opt.state[p]
                        slot[key] = targets[name_of[id(p)]]
                        # on the CPU, as torch's Adam keeps its step counter unless capturable/fused
                        slot["step"] = torch.tensor(float(state["adam_step"]))
        self.steps = int(state["steps"])
