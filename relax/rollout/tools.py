"""Tools for multi-turn episodes: a tool is a name, a JSON-schema description of its arguments and a
Python callable; ``ToolEnvironment`` parses the model's tool calls, runs them and returns their
output as the environment's turn.

Two call syntaxes (``parse_tool_calls``):

- ``"json"``, the way Qwen's chat template writes calls:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12+34"}}</tool_call>``; results
  come back as ``<tool_response>...</tool_response>`` (what the template writes for a tool message).
- ``"compact"``, for small vocabularies (the tiny model): ``<NAME>text</NAME>`` calls tool ``NAME``
  with its single string argument ``text``; results come back as ``<r>...</r>``.

A malformed call (bad JSON, unknown tool, wrong arguments, the tool raising) is not a crash: its
error becomes the observation, so the model can learn from it, and ``info["tool_error"]`` says what
went wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from relax.rollout.environments.base import Environment, EnvStep

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
               "object": dict}


class ToolCallError(ValueError):
    """A call the environment cannot run; its message is shown to the model."""


@attrs.frozen(kw_only=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments: {"type": "object", "properties": ...}
    fn: Callable[..., Any]

    def schema(self) -> dict:
        """The function description chat templates take (``tools=[tool.schema()]``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}

    def check_arguments(self, arguments) -> None:
        if not isinstance(arguments, Mapping):
            raise ToolCallError(f"{self.name}: arguments must be an object, got {type(arguments).__name__}")
        properties = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", ()) if k not in arguments]
        if missing:
            raise ToolCallError(f"{self.name}: missing argument(s) {', '.join(missing)}")
        for key, value in arguments.items():
            if key not in properties:
                raise ToolCallError(f"{self.name}: unknown argument {key!r}")
            expected = _JSON_TYPES.get(properties[key].get("type"))
            wrong_bool = isinstance(value, bool) and properties[key].get("type") in ("integer", "number")
            if expected is not None and (not isinstance(value, expected) or wrong_bool):
                raise ToolCallError(f"{self.name}: argument {key!r} must be {properties[key]['type']}")

    def __call__(self, arguments: Mapping[str, Any]) -> str:
        self.check_arguments(arguments)
        try:
            return str(self.fn(**arguments))
        except Exception as exc:
            raise ToolCallError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc


@attrs.frozen
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


_JSON_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, syntax: str, tools: Sequence[Tool]) -> list[ToolCall]:
    """Every tool call in ``text`` (none: the model answered). Raises ``ToolCallError`` for a call
    that is there but cannot be read."""
    if syntax == "json":
        if "<tool_call>" in text and not _JSON_CALL.search(text):
            raise ToolCallError("a <tool_call> without its closing </tool_call>")
        calls = []
        for body in _JSON_CALL.findall(text):
            try:
                call = json.loads(body)
            except json.JSONDecodeError as exc:
                raise ToolCallError(f"the tool call is not valid JSON: {exc}") from None
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ToolCallError('a tool call must be {"name": ..., "arguments": {...}}')
            calls.append(ToolCall(call["name"], call.get("arguments", {})))
        return calls
    if syntax == "compact":
        calls = []
        for tool in tools:
            opening, closing = f"<{tool.name}>", f"</{tool.name}>"
            for match in re.finditer(re.escape(opening) + "(.*?)(" + re.escape(closing) + "|$)", text, re.DOTALL):
                if not match.group(2):
                    raise ToolCallError(f"{opening} without its closing {closing}")
                (argument,) = tool.parameters.get("required", ())[:1] or ("input",)
                calls.append(ToolCall(tool.name, {argument: match.group(1)}))
        return calls
    raise ValueError(f"unknown tool-call syntax {syntax!r}; use 'json' or 'compact'")


def format_results(results: Sequence[str], syntax: str) -> str:
    if syntax == "json":
        return "".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return "".join(f"<r>{r}</r>" for r in results)


class ToolEnvironment(Environment):
    """An episode in which the model may call ``tools`` before it answers.

    Subclasses set ``tools`` (and ``syntax``) and implement ``score(answer) -> {component: number}``
    for the final answer; ``self.sample`` holds the prompt row. A turn with tool calls gets their
    results as the observation; a turn without calls is the answer and ends the episode (so do
    ``max_tool_turns`` turns of calls: the next turn must answer).
    """

    tools: Sequence[Tool] = ()
    syntax: str = "json"
    max_tool_turns: int = 3

    def reset(self, sample):
        self.sample, self.tool_turns = sample, 0

    def score(self, answer: str) -> Mapping[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must implement score(answer)")

    def step(self, completion: str) -> EnvStep:
        by_name = {t.name: t for t in self.tools}
        try:
            calls = parse_tool_calls(completion, self.syntax, self.tools)
        except ToolCallError as exc:
            return self._tool_turn(self.error_observation(str(exc)), {"tool_calls": 0, "tool_error": str(exc)})
        if not calls or self.tool_turns >= self.max_tool_turns:
            return EnvStep(done=True, rewards=self.score(completion), info={"tool_calls": 0})
        results, errors = [], []
        for call in calls:
            try:
                if call.name not in by_name:
                    raise ToolCallError(f"unknown tool {call.name!r}; tools: {', '.join(by_name)}")
                results.append(by_name[call.name](call.arguments))
            except ToolCallError as exc:
                results.append(None)
                errors.append(str(exc))
        info = {"tool_calls": len(calls), **({"tool_error": "; ".join(errors)} if errors else {})}
        if errors and all(r is None for r in results):
            return self._tool_turn(self.error_observation("; ".join(errors)), info)
        shown = [r if r is not None else f"error: {e}" for r, e in zip(results, _errors_in_order(results, errors))]
        return self._tool_turn(format_results(shown, self.syntax), info)

    def error_observation(self, message: str) -> str:
        """What the model sees for calls that all failed (override for a small vocabulary)."""
        return f"error: {message}"

    def _tool_turn(self, observation: str, info: dict) -> EnvStep:
        self.tool_turns += 1
        return EnvStep(observation=observation, info=info)


def _errors_in_order(results: Sequence[str | None], errors: Sequence[str]) -> list[str | None]:
    """Pairs each failed result (None) with its error message, in call order."""
    pending = iter(errors)
    return [next(pending) if r is None else None for r in results]


__all__ = ["Tool", "ToolCall", "ToolCallError", "ToolEnvironment", "format_results", "parse_tool_calls"]
