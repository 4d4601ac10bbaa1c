import pytest
import torch

from relax.models.hf import HFTokenizer, load_hf_model, load_hf_tokenizer


def test_loads_every_family(checkpoints, family):
    model = load_hf_model(checkpoints[family])
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 < n_params < 1_000_000
    assert not model.training  # dropout off: log-probs are a function of the weights
    assert next(model.parameters()).dtype == torch.float32
    assert type(model).__name__.lower().startswith(family)


def test_missing_directory_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--hf-checkpoint .*does not exist"):
        load_hf_model(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"--ref-load"):
        load_hf_model(tmp_path / "nope", flag="--ref-load")


def test_directory_without_config_is_rejected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no config.json.*weights.bin"):
        load_hf_tokenizer(tmp_path)


def test_file_instead_of_directory(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        load_hf_model(f)


def test_tokenizer_protocol(checkpoints):
    tok = load_hf_tokenizer(checkpoints["llama"])
    assert isinstance(tok, HFTokenizer)
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 2, 1)
    assert tok.stop_ids == (2,)
    ids = tok.encode("what is 3 + 4 ?")
    assert ids[0] == tok.bos_id and len(ids) == 7
    assert tok.decode(ids) == "<bos> what is 3 + 4 ?"


def test_chat_template_bos_is_not_doubled(checkpoints):
    tok = load_hf_tokenizer(checkpoints["qwen3"])
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert text.startswith("<bos><|im_start|> user : hello <|im_end|>")
    assert text.endswith("<|im_start|> assistant : ")
    ids = tok.encode(text)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id


def test_pad_falls_back_to_eos_and_generation_config_adds_stop_ids(checkpoints):
    class NoPad:
        eos_token_id, pad_token_id, bos_token_id = 5, None, None

    tok = HFTokenizer(NoPad(), extra_stop_ids=[9, 5])
    assert tok.pad_id == 5
    assert tok.stop_ids == (5, 9)


def test_tiny_random_byte_level_checkpoint(tmp_path):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    path = build_tiny_random_checkpoint(tmp_path / "byte", "llama", tie=True)
    tok = load_hf_tokenizer(path)
    text = "Maya picks 14 apples — é?\n"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and len(ids) == 1 + len(text.encode("utf-8"))  # one token per byte
    assert tok.decode(ids[1:]) == text
    im_end = tok.hf.convert_tokens_to_ids("<|im_end|>")
    assert tok.stop_ids == (tok.eos_id, im_end)  # generation_config lists both
    model = load_hf_model(path)
    assert (
        model.config.tie_word_embeddings and 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    )
