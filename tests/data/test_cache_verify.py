"""A reused token cache is verified: meta.json records each shard's content hash; a shard
changed on disk (same size) is prepared again, and ids outside the vocabulary are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scalelab.data import DataConfig, TokenizerConfig, prepare
from scalelab.data.shards import shard_digest


def _prepare(corpus: Path, cache: Path):
    return prepare(DataConfig(name="text_files", paths=[str(corpus)]), TokenizerConfig(name="char"), cache,
                   progress=True)


@pytest.fixture()
def prepared(tmp_path: Path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(400)))
    return corpus, tmp_path / "cache", _prepare(corpus, tmp_path / "cache")


def test_a_shard_overwritten_in_place_is_prepared_again(prepared, capsys) -> None:
    corpus, cache, p = prepared
    hashes = p.meta["content_hash"]
    assert set(hashes) == {"train", "val"} and hashes["train"].startswith("blake2b:")
    original = np.array(p.tokens("train"))
    size = p.train_path.stat().st_size
    with open(p.train_path, "r+b") as f:  # 95 % of the file, same size, ids still in vocabulary
        f.write(np.zeros(int(len(original) * 0.95), dtype=p.dtype).tobytes())
    assert p.train_path.stat().st_size == size
    capsys.readouterr()
    again = _prepare(corpus, cache)
    out = capsys.readouterr().out
    assert "train.bin changed on disk" in out and "reusing" not in out, out
    assert np.array_equal(np.array(again.tokens("train")), original)
    assert again.meta["content_hash"] == hashes


def test_ids_outside_the_vocabulary_are_one_line(prepared) -> None:
    corpus, cache, p = prepared
    ids = np.array(p.tokens("val"))
    ids[3] = p.vocab_size + 7
    p.val_path.write_bytes(ids.astype(p.dtype).tobytes())
    meta = json.loads((p.dir / "meta.json").read_text())  # hash edited to match: only ids tell
    meta["content_hash"]["val"] = shard_digest(p.val_path, meta["dtype"])[0]
    (p.dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"holds token id \d+, outside the vocabulary") as e:
        _prepare(corpus, cache)
    assert "\n" not in str(e.value) and str(p.dir) in str(e.value)


def test_a_cache_without_hashes_is_prepared_again(prepared, capsys) -> None:
    corpus, cache, p = prepared
    meta = json.loads((p.dir / "meta.json").read_text())
    recorded = meta.pop("content_hash")
    (p.dir / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    again = _prepare(corpus, cache)
    assert "no content hash to verify them by" in capsys.readouterr().out
    assert again.meta["content_hash"] == recorded
