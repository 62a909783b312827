"""Attention at small heads on this CPU: scalelab's kernel and the batched-matmul path against
SDPA, and what the model takes.

For each shape (a CPU sweep point's heads are 4 or 8 wide, 64 positions, 1 thread a run),
forward + backward of every path in alternating blocks on q, k, v laid out as the model's
(strided views of one projection), causal; prints the medians, each path's speed over SDPA's,
and the choice ``small_head_attention.pays`` makes here, timed its own way. Where the chosen path
runs slower than SDPA, the model keeps SDPA.

    python -m benchmarks.small_heads [--rounds 7] [--reps 30] [--threads 1]
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
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a sweep point runs 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from scalelab.model import small_head_attention as sha

    kernel = sha.kernel_runs()

    def path(use_kernel: bool) -> Callable[..., torch.Tensor]:
        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            sha.USE_KERNEL = use_kernel
            return sha.attention(q, k, v, None, True, None)
        return run

    paths = {"SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             **({"kernel": path(True)} if kernel else {}), "matmuls": path(False)}
    print(f"torch threads {torch.get_num_threads()}; scalelab's kernel "
          f"{'built' if kernel else 'unavailable (see the warning)'}")
    print(f"{'B, H, T, hd':>16s} " + " ".join(f"{n + ' us':>11s}" for n in paths)
          + " " + " ".join(f"{n + ' speed':>14s}" for n in list(paths)[1:]) + "  the model takes")
    for b, h, t, hd in SHAPES:
        fused = torch.randn(b, t, 3, h, hd)
        qkv = tuple(fused[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, run in paths.items():
                times[name].append(_per_call_us(run, qkv, args.reps))
        us = {n: statistics.median(times[n]) for n in paths}
        sha.USE_KERNEL = True
        takes = sha._path_name() if sha.chosen(qkv[0], qkv[1], None, True, 0.0) else "SDPA"
        print(f"{(b, h, t, hd)!s:>16s} " + " ".join(f"{us[n]:11.0f}" for n in paths) + " "
              + " ".join(f"{us['SDPA'] / us[n]:13.2f}x" for n in list(paths)[1:]) + f"  {takes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
