"""The shipped warm-up checkpoint of the built-in ``TinyCausalLM`` (made by ``relax.recipes.warmup``).

Both the rollout engine and the trainer start from it, each loading it itself, so no weights are
sent around at start-up.
"""

from __future__ import annotations

from pathlib import Path

import torch

from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

CHECKPOINT = Path(__file__).parent / "checkpoint" / "warmup.pt"


def load_warmup_model(path: str | Path | None = None) -> TinyCausalLM:
    """The shipped warm-up model (or the checkpoint at ``path``)."""
    path = Path(path) if path is not None else CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(
            f"no warm-up checkpoint at {path}; regenerate it with python -m relax.recipes.warmup --out {path}"
        )
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyCausalLM(TinyLMConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval()


def save_tiny_checkpoint(model: TinyCausalLM, path: Path, recipe: dict, base_rates: dict[str, float]) -> None:
    """Write ``model`` in the form ``load_warmup_model`` reads, with the recipe that made it and its
    base rates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save({"config": model.config.to_dict(), "model": state, "recipe": recipe, "base_rates": base_rates}, path)


def warmup_base_rates(path: str | Path | None = None) -> dict[str, float]:
    """The base rates recorded in the checkpoint when it was made (``measure_base_rates``)."""
    path = Path(path) if path is not None else CHECKPOINT
    return dict(torch.load(path, map_location="cpu", weights_only=True)["base_rates"])
