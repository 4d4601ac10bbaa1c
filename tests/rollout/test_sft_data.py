"""``relax.rollout.sft_data``: the demonstrations' row checks, tokenization and batch layout."""

from __future__ import annotations

import json

import pytest
import torch

from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.data import PromptDataError
from relax.rollout.sft_data import SftExample, read_sft_examples, sft_batch

TOK = TinyTokenizer()


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_pair_is_prompt_then_completion_with_eos(tmp_path):
    data = _write(tmp_path / "d.jsonl", [{"prompt": "<bos>3+4=", "completion": "<a>7</a>"},
                                         {"prompt": "<bos>9+9=", "completion": "<a>18</a><eos>"}])
    first, second = read_sft_examples(str(data), TOK)
    assert first.prompt_ids == tuple(TOK.encode("<bos>3+4="))
    assert first.response_ids == (*TOK.encode("<a>7</a>"), TOK.eos_id)  # the model learns to stop
    assert first.loss_mask == (True,) * 4
    assert second.response_ids == tuple(TOK.encode("<a>18</a><eos>"))  # already ends with <eos>: not doubled


def test_custom_keys(tmp_path):
    data = _write(tmp_path / "d.jsonl", [{"q": "<bos>1+1=", "a": "<a>2</a>"}])
    (example,) = read_sft_examples(str(data), TOK, prompt_key="q", completion_key="a")
    assert TOK.decode(list(example.response_ids)) == "<a>2</a><eos>"


def test_every_bad_row_is_named_with_file_row_and_key(tmp_path):
    data = _write(tmp_path / "bad.jsonl", [
        {"prompt": "<bos>1+1=", "completion": "<a>2</a>"},
        {"prompt": "<bos>1+2=", "answer": "<a>3</a>"},  # wrong key name
        {"prompt": "<bos>1+3=", "completion": "  "},  # empty completion
        "[1, 2]",  # not an object
        "{not json",
        {"completion": "<a>5</a>"},  # no prompt
    ])
    with pytest.raises(PromptDataError) as info:
        read_sft_examples(str(data), TOK)
    message = str(info.value)
    assert f"--data {data}: 5 bad lines" in message
    assert "line 2: no key 'completion' (--completion-key); the row's keys: 'prompt', 'answer'" in message
    assert "line 3: key 'completion' is empty" in message
    assert "line 4: must be a JSON object, got list" in message
    assert "line 5: not valid JSON" in message
    assert "line 6: no key 'prompt' (--prompt-key)" in message
    assert [n for n, _ in info.value.errors] == [2, 3, 4, 5, 6]


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--data '.*nope.jsonl' does not exist"):
        read_sft_examples(str(tmp_path / "nope.jsonl"), TOK)
    with pytest.raises(ValueError, match="holds no rows"):
        read_sft_examples(str(_write(tmp_path / "empty.jsonl", [])), TOK)


def test_parquet_rows(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["<bos>2+2=", "<bos>5+1="], "completion": ["<a>4</a>", ""]}), str(path))
    with pytest.raises(PromptDataError, match="row 2: key 'completion' is empty"):
        read_sft_examples(str(path), TOK)


def test_chat_needs_a_chat_template(tmp_path):
    data = _write(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "1+1"},
                                                       {"role": "assistant", "content": "2"}]}])
    with pytest.raises(PromptDataError, match="line 1: key 'messages': chat messages need a tokenizer with a chat"):
        read_sft_examples(str(data), TOK)


def _byte_tokenizer():
    pytest.importorskip("transformers")
    from relax.models.hf.loading import HFTokenizer
    from relax.models.hf.tiny_random import build_byte_tokenizer

    return HFTokenizer(build_byte_tokenizer())


def test_chat_trains_on_the_assistant_turns_only(tmp_path):
    tok = _byte_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"}, {"role": "user", "content": "and 2+2?"},
                {"role": "assistant", "content": "four"}]
    data = _write(tmp_path / "c.jsonl", [{"messages": messages}])
    (example,) = read_sft_examples(str(data), tok)
    full = tok.hf.apply_chat_template(messages, tokenize=False)
    assert list(example.prompt_ids + example.response_ids) == tok.encode(full)
    assert tok.decode(list(example.prompt_ids)).endswith("<|im_start|>assistant\n")  # up to the first answer
    trained = [t for t, m in zip(example.response_ids, example.loss_mask) if m]
    assert tok.decode(trained) == "2<|im_end|>\nfour<|im_end|>\n"
    untrained = tok.decode([t for t, m in zip(example.response_ids, example.loss_mask) if not m])
    assert untrained == "<|im_start|>user\nand 2+2?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(("messages", "problem"), [
    ([{"role": "user", "content": "hi"}], "has no assistant turn"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}], "an assistant turn is empty"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant"}], "message 1 must be"),
    ([], "must be a non-empty list"),
])
def test_bad_conversations(tmp_path, messages, problem):
    tok = _byte_tokenizer()
    data = _write(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "a"},
                                                       {"role": "assistant", "content": "b"}]},
                                         {"messages": messages}])
    with pytest.raises(PromptDataError, match=f"line 2: key 'messages'.*{problem}"):
        read_sft_examples(str(data), tok)


def test_batch_layout():
    a = SftExample((5, 6, 7), (8, 9), (True, True))
    b = SftExample((5,), (8, 1, 9), (True, False, True))
    batch = sft_batch([a, b], pad_id=0)
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 5]]  # left-padded
    assert batch.prompt_mask.tolist() == [[True] * 3, [False, False, True]]
    assert batch.response_ids.tolist() == [[8, 9, 0], [8, 1, 9]]  # right-padded
    assert batch.response_mask.tolist() == [[True, True, False], [True, False, True]]  # the loss mask
    assert batch.response_attention_mask.tolist() == [[True, True, False], [True, True, True]]
    plain = sft_batch([a], pad_id=0)
    assert plain.response_attention_mask is None and torch.equal(plain.response_mask, torch.ones(1, 2, dtype=torch.bool))
