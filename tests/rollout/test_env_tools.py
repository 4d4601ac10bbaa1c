"""Tools: argument checks, both call syntaxes, and malformed calls as observations."""

from __future__ import annotations

import pytest

from relax.rollout.tools import Tool, ToolCallError, ToolEnvironment, parse_tool_calls


def _add(a: int, b: int) -> int:
    return a + b


ADD = Tool(name="add", description="a + b", fn=_add,
           parameters={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]})
CALC = Tool(name="calc", description="evaluate a sum", fn=lambda expression: sum(map(int, expression.split("+"))),
            parameters={"type": "object", "properties": {"expression": {"type": "string"}},
                        "required": ["expression"]})


def test_schema_and_argument_checks():
    assert ADD.schema()["function"]["parameters"]["required"] == ["a", "b"]
    assert ADD({"a": 2, "b": 40}) == "42"
    for bad, match in [({"a": 1}, "missing argument"), ({"a": 1, "b": "2"}, "'b' must be integer"),
                       ({"a": True, "b": 1}, "'a' must be integer"), ({"a": 1, "b": 2, "c": 3}, "unknown argument")]:
        with pytest.raises(ToolCallError, match=match):
            ADD(bad)


def test_json_calls_as_qwen_writes_them():
    text = 'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    (call,) = parse_tool_calls(text, "json", [ADD])
    assert (call.name, dict(call.arguments)) == ("add", {"a": 3, "b": 4})
    assert parse_tool_calls("The answer is 7.", "json", [ADD]) == []
    with pytest.raises(ToolCallError, match="not valid JSON"):
        parse_tool_calls("<tool_call>{name: add}</tool_call>", "json", [ADD])
    with pytest.raises(ToolCallError, match="without its closing"):
        parse_tool_calls('<tool_call>{"name": "add"}', "json", [ADD])


def test_compact_calls():
    (call,) = parse_tool_calls("<calc>12+34</calc><eos>", "compact", [CALC])
    assert (call.name, dict(call.arguments)) == ("calc", {"expression": "12+34"})
    with pytest.raises(ToolCallError, match="without its closing"):
        parse_tool_calls("<calc>12+3", "compact", [CALC])


class AddEnv(ToolEnvironment):
    tools = (ADD,)
    max_tool_turns = 2

    def score(self, answer):
        return {"correct": float(str(self.sample["label"]) in answer)}


def test_tool_environment_runs_calls_and_scores_the_answer():
    env = AddEnv()
    env.reset({"prompt": "3+4?", "label": 7, "metadata": {}})
    step = env.step('<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>')
    assert step.observation == "<tool_response>\n7\n</tool_response>" and not step.done
    assert step.info == {"tool_calls": 1}
    final = env.step("It is 7.")
    assert final.done and final.rewards == {"correct": 1.0}


@pytest.mark.parametrize("completion, error", [
    ('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', "unknown tool 'mul'"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "missing argument(s) b"),
    ("<tool_call>not json</tool_call>", "not valid JSON"),
])
def test_malformed_calls_are_observations_not_crashes(completion, error):
    env = AddEnv()
    env.reset({"prompt": "", "label": 7, "metadata": {}})
    step = env.step(completion)
    assert not step.done and "error: " in step.observation and error in step.observation
    assert error in step.info["tool_error"]


def test_a_tool_that_raises_is_an_observation():
    boom = Tool(name="boom", description="", parameters={"type": "object", "properties": {}}, fn=lambda: 1 / 0)

    class Env(AddEnv):
        tools = (boom,)

    env = Env()
    env.reset({"prompt": "", "label": 1, "metadata": {}})
    step = env.step('<tool_call>{"name": "boom", "arguments": {}}</tool_call>')
    assert "boom raised ZeroDivisionError" in step.observation and step.info["tool_calls"] == 1


def test_tool_turns_are_bounded():
    env = AddEnv()
    env.reset({"prompt": "", "label": 7, "metadata": {}})
    call = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    assert not env.step(call).done and not env.step(call).done
    assert env.step(call).done  # the third turn of calls is taken as the answer
