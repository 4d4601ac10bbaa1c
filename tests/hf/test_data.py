"""``--prompt-data``: JSONL / Parquet rows -> Prompts, line-numbered errors, length filter, chat
template, seeded epochs and resume. Uses both the built-in tiny tokenizer and an HF tokenizer."""

import json
import warnings

import pytest

from relax.rollout.base import Prompt
from relax.rollout.data import PromptDataset, prompt_iterator_from_config
from relax.rollout.prompt_files import PromptDataError
from relax.rollout.prompt_iterator import PromptIterator
from relax.models.hf import load_hf_tokenizer
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.config.run import RunConfig


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(row if isinstance(row, str) else json.dumps(row))
            f.write("\n")
    return path


def addition_rows(n=10):
    return [{"prompt": f"<bos>{a}+{a + 1}=", "label": 2 * a + 1, "meta": {"a": a}} for a in range(n)]


def test_tiny_tokenizer_jsonl_for_the_builtin_task(tmp_path):
    path = write_jsonl(tmp_path / "add.jsonl", addition_rows(5))
    ds = PromptDataset(path, TinyTokenizer(), metadata_key="meta")
    assert len(ds) == 5
    assert ds[2] == Prompt(text="<bos>2+3=", label=5, metadata={"a": 2})
    assert ds.prompt_lengths == [5] * 5


def test_bad_rows_are_listed_with_line_numbers(tmp_path):
    rows = addition_rows(3) + [
        {"question": "<bos>1+1=", "label": 2},  # line 4: no input key
        "",  # line 5: blank, ignored
        "{not json",  # line 6
        {"prompt": "<bos>1+x=", "label": 2},  # line 7: tiny tokenizer rejects 'x'
        {"prompt": "<bos>1+1="},  # line 8: no label
        [1, 2],  # line 9: not an object
        {"prompt": 12, "label": 1},  # line 10: not a string
        {"prompt": "", "label": 0},  # line 11: no tokens
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(PromptDataError) as info:
        PromptDataset(path, TinyTokenizer())
    err = info.value
    assert [line for line, _ in err.errors] == [4, 6, 7, 8, 9, 10, 11]
    text = str(err)
    assert "7 bad lines" in text and "... and 2 more" in text
    assert "line 4: missing --input-key 'prompt' (keys: 'question', 'label')" in text
    assert "line 6: not valid JSON" in text
    assert "line 7: the tokenizer failed on '<bos>1+x='" in text
    assert "line 8: missing --label-key 'label'" in text
    assert "line 9" in text and "line 10" not in text  # only the first five are listed
    assert "line 10: --input-key 'prompt' must be a string" in [f"line {n}: {m}" for n, m in err.errors][5]


def test_no_label_key_and_missing_metadata_key(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "<bos>1+2="}])
    ds = PromptDataset(path, TinyTokenizer(), label_key="")
    assert ds[0].label is None
    with pytest.raises(PromptDataError, match="line 1: missing --metadata-key 'extra'"):
        PromptDataset(path, TinyTokenizer(), label_key=None, metadata_key="extra")
    path2 = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "<bos>1+2=", "label": 3, "meta": [1]}])
    with pytest.raises(PromptDataError, match="must hold an object, got list"):
        PromptDataset(path2, TinyTokenizer(), metadata_key="meta")


def test_max_prompt_len_drops_and_counts_with_a_warning(tmp_path):
    rows = addition_rows(3) + [
        {"prompt": "<bos>1+2+3+4=", "label": 10},
        {"prompt": "<bos>11+22=", "label": 33},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.warns(
        UserWarning,
        match=r"dropped 2 of 5 prompts longer than --max-prompt-len 5 tokens, e\.g\. "
        r"line 4 \(9 tokens\), line 5 \(7 tokens\)",
    ):
        ds = PromptDataset(path, TinyTokenizer(), max_prompt_len=5)
    assert ds.num_too_long == 2 and len(ds) == 3 and ds.line_numbers == [1, 2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PromptDataset(path, TinyTokenizer(), max_prompt_len=9).num_too_long == 0
    with (
        pytest.raises(ValueError, match="no usable prompt"),
        pytest.warns(UserWarning, match="dropped 5 of 5"),
    ):
        PromptDataset(path, TinyTokenizer(), max_prompt_len=2)


def test_prompt_suffix_without_template(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "<bos>1+2", "label": 3}])
    assert PromptDataset(path, TinyTokenizer(), prompt_suffix="=")[0].text == "<bos>1+2="


def test_chat_template_system_prompt_and_suffix(tmp_path, checkpoints):
    tok = load_hf_tokenizer(checkpoints["qwen3"])
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": "what is 3 + 4", "answer": "7"},
            {"question": [{"role": "user", "content": "hello"}], "answer": "hi"},
        ],
    )
    ds = PromptDataset(
        path,
        tok,
        input_key="question",
        label_key="answer",
        apply_chat_template=True,
        system_prompt="you are a helpful bot",
        prompt_suffix=" ?",
    )
    assert ds[0].text == (
        "<bos><|im_start|> system : you are a helpful bot <|im_end|> "
        "<|im_start|> user : what is 3 + 4 ? <|im_end|> <|im_start|> assistant : "
    )
    assert ds[1].text.endswith("<|im_start|> user : hello ? <|im_end|> <|im_start|> assistant : ")
    assert ds.prompt_lengths[0] == len(tok.encode(ds[0].text))
    assert tok.encode(ds[0].text).count(tok.bos_id) == 1


def test_chat_template_errors(tmp_path, checkpoints):
    tok = load_hf_tokenizer(checkpoints["qwen3"])
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}], "label": 1},
            {"prompt": [{"role": "user"}], "label": 1},
        ],
    )
    with pytest.raises(PromptDataError) as info:
        PromptDataset(path, tok, apply_chat_template=True, system_prompt="s")
    assert [n for n, _ in info.value.errors] == [1, 2]
    assert "own system message" in str(info.value) and "message 0 must be" in str(info.value)
    with pytest.raises(
        PromptDataError, match="line 1: --input-key 'prompt' holds a list of messages; that needs"
    ):
        PromptDataset(path, tok)
    with pytest.raises(ValueError, match="--system-prompt needs --apply-chat-template"):
        PromptDataset(path, tok, system_prompt="s")
    with pytest.raises(ValueError, match="has no chat template"):
        PromptDataset(path, TinyTokenizer(), apply_chat_template=True)


def test_parquet(tmp_path, checkpoints):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")
    import pyarrow as pa

    table = pa.table(
        {
            "prompt": ["hello", None, "what is 1 + 1"],
            "label": ["a", "b", "c"],
            "meta": ['{"id": 1}', '{"id": 2}', '{"id": 3}'],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    tok = load_hf_tokenizer(checkpoints["llama"])
    with pytest.raises(PromptDataError, match="(?s)1 bad row .*row 2: --input-key 'prompt' must be a string"):
        PromptDataset(tmp_path / "d.parquet", tok, metadata_key="meta")
    pq.write_table(table.filter(pa.array([True, False, True])), tmp_path / "ok.parquet")
    ds = PromptDataset(tmp_path / "ok.parquet", tok, metadata_key="meta")
    assert [(p.text, p.label, dict(p.metadata)) for p in ds] == [
        ("hello", "a", {"id": 1}),
        ("what is 1 + 1", "c", {"id": 3}),
    ]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        PromptDataset(tmp_path / "d.parquet", TinyTokenizer())


def test_unknown_extension_and_missing_file(tmp_path):
    (tmp_path / "d.csv").write_text("prompt,label\n")
    with pytest.raises(ValueError, match="unknown file type '.csv'"):
        PromptDataset(tmp_path / "d.csv", TinyTokenizer())
    with pytest.raises(FileNotFoundError, match="--prompt-data"):
        PromptDataset(tmp_path / "none.jsonl", TinyTokenizer())


def texts(prompts):
    return [p.text for p in prompts]


def test_iterator_epochs_are_seeded_permutations_and_resume_exactly():
    prompts = [Prompt(text=str(i)) for i in range(7)]
    it = PromptIterator(prompts, seed=3)
    first = texts(it.next_batch(7))
    second = texts(it.next_batch(7))
    assert sorted(first) == sorted(second) == [str(i) for i in range(7)]  # every prompt once per epoch
    assert first != second  # a fresh order each epoch
    assert texts(PromptIterator(prompts, seed=3).next_batch(14)) == first + second  # same seed, same stream
    assert texts(PromptIterator(prompts, seed=4).next_batch(7)) != first
    assert texts(PromptIterator(prompts, shuffle=False).next_batch(8)) == [str(i) for i in range(7)] + ["0"]

    it = PromptIterator(prompts, seed=3)
    it.next_batch(10)
    state = it.state_dict()
    assert state == {"epoch": 1, "position": 3, "seed": 3, "num_prompts": 7}
    rest = texts(it.next_batch(9))
    resumed = PromptIterator(prompts, seed=3)
    resumed.load_state_dict(state)
    assert texts(resumed.next_batch(9)) == rest
    with pytest.raises(ValueError, match="same --prompt-data, --max-prompt-len and --seed"):
        PromptIterator(prompts[:6], seed=3).load_state_dict(state)


def test_iterator_from_run_config(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", addition_rows(6))
    config = RunConfig(prompt_data=str(path), seed=5, max_prompt_len=5)
    it = prompt_iterator_from_config(config, TinyTokenizer())
    got = it.next_batch(6)
    assert sorted(p.label for p in got) == [1, 3, 5, 7, 9, 11]
    assert texts(got) == texts(
        PromptIterator(PromptDataset(path, TinyTokenizer()).prompts, seed=5).next_batch(6)
    )
