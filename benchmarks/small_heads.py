"""Attention at small heads on this CPU: the written-out path against SDPA, and what the model takes.

For each shape (a CPU sweep point's heads are 4 or 8 wide, 64 positions, 1 thread), forward +
backward of both paths in alternating blocks on q, k, v laid out as the model's (strided views
of one projection), causal; prints the medians, their ratio, and the choice
``small_head_attention.pays`` makes here, timed its own way. Where the written-out path runs
slower than SDPA, the model keeps SDPA.

    python -m benchmarks.small_heads [--rounds 7] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

SHAPES = [(7, 3, 64, 4), (7, 2, 64, 8), (19, 3, 64, 4), (7, 4, 64, 8), (12, 4, 64, 8)]  # B, H, T, hd


def _per_call_us(path: Callable[..., torch.Tensor], qkv: tuple[torch.Tensor, ...], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        path(*qkv).sum().backward()
    return (time.perf_counter() - t0) / reps * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from scalelab.model import small_head_attention as sha

    paths = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             "written out": lambda q, k, v: sha.attention(q, k, v, None, True, None)}
    print(f"{'B, H, T, hd':>16s} {'SDPA us':>9s} {'written us':>11s} {'written speed':>14s}  the model takes")
    for b, h, t, hd in SHAPES:
        fused = torch.randn(b, t, 3, h, hd)
        qkv = tuple(fused[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, path in paths.items():
                times[name].append(_per_call_us(path, qkv, args.reps))
        sdpa, written = (statistics.median(times[n]) for n in paths)
        takes = "written out" if sha.pays(qkv[0], qkv[1], None, True) else "SDPA"
        print(f"{(b, h, t, hd)!s:>16s} {sdpa:9.0f} {written:11.0f} {sdpa / written:13.2f}x  {takes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
