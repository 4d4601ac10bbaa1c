"""TextArena games as relax environments (``textarena==0.7.4``: ``pip install -e '.[envs]' torch==2.13.0``).

TextArena's single-player text games (GuessTheNumber, Mastermind, Hangman, Wordle, ...) run in
process: ``reset`` writes the game's opening instructions, every ``step(action)`` answers the
player's move with the game's messages, and ``close`` gives the reward when the game is over. The
adapter maps that onto ``Environment``:

- a prompt row says which game and which seed: ``metadata["env_id"]`` (e.g. ``"GuessTheNumber-v0"``)
  and ``metadata["seed"]``; its prompt is the game's opening text (``opening_prompts`` writes such
  rows, so the episode's first tokens are exactly what the game would show);
- ``step(completion)`` plays the completion as the move; the game's new messages (not the echo of
  the move) are the observation; when the game ends, its reward is the component ``reward``
  (``info`` holds TextArena's step and game info).

TextArena seeds Python's global ``random`` from the seed it is given (its own convention); relax's
sampling does not use that generator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from relax.rollout.environments.base import Environment, EnvStep

REWARD_KEY = "reward"
PLAYER = 0


def _textarena():
    try:
        import textarena
    except ImportError as exc:
        raise ImportError("the TextArena environments need textarena: "
                          "pip install -e '.[envs]' torch==2.13.0") from exc
    return textarena


def _messages(observation, *, skip_own_moves: bool) -> str:
    """TextArena's raw observation (``[(from_id, message, type), ...]``) as plain text."""
    ta = _textarena()
    lines = []
    for from_id, message, kind in observation:
        if skip_own_moves and kind == ta.ObservationType.PLAYER_ACTION and from_id == PLAYER:
            continue
        lines.append(str(message))
    return "\n".join(lines)


def start_game(env_id: str, seed: int):
    """A fresh game (without TextArena's LLM observation wrappers) and its opening text."""
    ta = _textarena()
    game = ta.make(f"{env_id}-raw")
    game.reset(num_players=1, seed=seed)
    _, observation = game.get_observation()
    return game, _messages(observation, skip_own_moves=True)


def opening_prompts(env_id: str, seeds) -> list[dict]:
    """``--prompt-data`` rows for ``env_id``: ``{"prompt": opening text, "label": None, "metadata": {...}}``."""
    rows = []
    for seed in seeds:
        _, opening = start_game(env_id, int(seed))
        rows.append({"prompt": opening, "label": None, "metadata": {"env_id": env_id, "seed": int(seed)}})
    return rows


def _seed(sample: Mapping[str, Any]) -> int:
    meta = sample.get("metadata") or {}
    if "seed" in meta:
        return int(meta["seed"])
    return int.from_bytes(hashlib.sha256(str(sample.get("prompt")).encode()).digest()[:4], "big")


class TextArenaEnv(Environment):
    """One TextArena game per episode (``--env-path relax.rollout.environments.textarena:TextArenaEnv``).
    ``env_id``: the game when a row's metadata names none."""

    env_id: str | None = None

    def reset(self, sample: Mapping[str, Any]) -> None:
        meta = sample.get("metadata") or {}
        env_id = meta.get("env_id", self.env_id)
        if not env_id:
            raise ValueError("the prompt row's metadata names no TextArena game: set metadata.env_id "
                             "(e.g. 'GuessTheNumber-v0') or subclass TextArenaEnv with env_id")
        self.game, _ = start_game(str(env_id), _seed(sample))

    def step(self, completion: str) -> EnvStep:
        done, step_info = self.game.step(completion)
        _, observation = self.game.get_observation()
        text = _messages(observation, skip_own_moves=True)
        if not done:
            return EnvStep(observation=text or None, info=dict(step_info or {}))
        rewards, game_info = self.game.close()
        info = {"game_info": {str(k): v for k, v in (game_info or {}).items()}, "final_messages": text}
        return EnvStep(done=True, rewards={REWARD_KEY: float((rewards or {}).get(PLAYER, 0.0))}, info=info)


class GuessTheNumber(TextArenaEnv):
    """TextArena's GuessTheNumber-v0 (guess 1..20 in brackets, e.g. ``[7]``; hints say higher/lower)."""

    env_id = "GuessTheNumber-v0"
