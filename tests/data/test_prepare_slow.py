"""Slow prepare tests: a killed prepare leaves nothing complete-looking; the CLI; full pystdlib."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.data import DataConfig, PreparedData, TokenizerConfig, prepare

from .conftest import write

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_killed_prepare_leaves_no_complete_shard(tmp_path):
    line = "".join(chr(0x61 + i % 26) for i in range(200)) + " é\n"
    corpus = write(tmp_path / "big.txt", line * 120_000)  # ~24 MB, a few seconds to encode
    cache = tmp_path / "cache"
    code = (
        "from scalelab.data import DataConfig, TokenizerConfig, prepare\n"
        f"prepare(DataConfig(name='text_files', paths=[{str(corpus)!r}], num_threads=1), "
        f"TokenizerConfig(name='char'), {str(cache)!r})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not list(cache.rglob(".train.bin.*.tmp")):
            time.sleep(0.02)
        assert list(cache.rglob(".train.bin.*.tmp")), "prepare never started writing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (d,) = [p for p in cache.iterdir() if p.is_dir()]
    assert not (d / "meta.json").exists()
    with pytest.raises(FileNotFoundError):
        PreparedData.load(d)
    # the next prepare does the work again (not "reusing") and cleans the leftovers
    cfg = DataConfig(name="text_files", paths=[str(corpus)])
    p = prepare(cfg, TokenizerConfig(name="char"), cache, progress=False)
    assert p.dir == d and (d / "meta.json").exists()
    assert not list(d.glob("*.tmp")) and not list(d.glob(".*.tmp"))
    assert p.meta["train_tokens"] + p.meta["val_tokens"] == len(line) * 120_000


@pytest.mark.slow
def test_cli_prepares_then_reuses(tmp_path, shakespeare_path):
    exe = Path(sys.executable).parent / "scalelab-data"
    cmd = [
        str(exe) if exe.exists() else sys.executable,
        *([] if exe.exists() else ["-m", "scalelab.cli.data"]),
    ]
    args = [
        "data=shakespeare",
        "tokenizer=char",
        f"data.path={shakespeare_path}",
        f"paths.data_dir={tmp_path}",
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    r1 = subprocess.run(cmd + args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r1.returncode == 0, r1.stderr[-3000:]
    assert "1,003,854" in r1.stdout and "tokenizer char vocab 69" in r1.stdout
    r2 = subprocess.run(cmd + args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r2.returncode == 0 and "reusing cached shards" in r2.stdout


@pytest.mark.slow
def test_full_pystdlib_bpe4096(tmp_path):
    """The one test that touches the whole stdlib: bpe 4096, then a cached rerun."""
    cfg = DataConfig(name="pystdlib", encoding_errors="replace")
    tok = TokenizerConfig(name="bpe", vocab_size=4096)
    t0 = time.perf_counter()
    p = prepare(cfg, tok, tmp_path, progress=False)
    first = time.perf_counter() - t0
    m = p.meta
    print(
        f"\npystdlib bpe4096: {m['train_tokens']:,} train + {m['val_tokens']:,} val tokens, "
        f"{m['train_bytes'] + m['val_bytes']:,} bytes, {first:.1f}s, bad_bytes={m['bad_bytes']}"
    )
    assert m["vocab_size"] == 4096 and m["dtype"] == "uint16"
    assert m["train_tokens"] > 5_000_000 and m["bytes_per_token"] > 2.5
    assert json.loads((p.dir / "meta.json").read_text())["fingerprint"] == m["fingerprint"]
    written = {f.name: f.stat().st_mtime_ns for f in p.dir.iterdir()}
    again = prepare(cfg, tok, tmp_path, progress=False)
    assert again.dir == p.dir  # reused, not written again
    assert {f.name: f.stat().st_mtime_ns for f in p.dir.iterdir()} == written
