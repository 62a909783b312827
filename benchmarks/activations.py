# ruff: noqa: I001  (scalelab.cli sets the OpenMP policy: it must load before torch)
"""Forward and backward time of each MLP activation on this CPU, one thread.

    python -m benchmarks.activations [--shape 12,64,512] [--reps 50]
    python -m benchmarks.activations --train shakespeare_char,encoder [--steps 60]

``--train``: the bench's plain loop (scalelab's Transformer, the preset's batches and AdamW) with
``mlp: gelu`` against ``mlp: gelu_exact``, alternating step by step, CPU seconds per step.

The shape is the shakespeare_char MLP's hidden activation (batch 12, block 64, d_ff 512). Why it
exists: on an AVX2-only CPU, torch's tanh-approximate GELU (what ``mlp: gelu`` computes, as GPT-2
does) measured 4x slower than the exact erf GELU, and the sum of its forward and backward is a
fifth of a shakespeare_char training step (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import scalelab.cli  # noqa: F401
import torch
import torch.nn.functional as F

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu (tanh, mlp=gelu)": lambda t: F.gelu(t, approximate="tanh"),
    "gelu (exact erf)": F.gelu,
    "silu (swiglu's gate)": F.silu,
    "relu": F.relu,
}


def time_activation(fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...],
                    reps: int) -> tuple[float, float]:
    """Median (forward, backward) seconds over ``reps`` calls."""
    x = torch.randn(*shape, requires_grad=True)
    grad = torch.ones(*shape)
    fwd, bwd = [], []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        y = fn(x)
        t1 = time.perf_counter()
        y.backward(grad)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    return statistics.median(fwd[3:]), statistics.median(bwd[3:])


def train_ab(presets: list[str], steps: int) -> None:
    """Training steps with the tanh GELU against the exact one, interleaved (bench_train's loop)."""
    from benchmarks.bench_train import PRESETS, PlainLoop, prepare_preset, run_interleaved
    from scalelab.model import Transformer

    for name in presets:
        prep = prepare_preset(PRESETS[name])
        cfg = prep["model_cfg"]
        torch.manual_seed(0)
        loops = {"gelu": PlainLoop(Transformer(cfg), prep, "model"),
                 "gelu_exact": PlainLoop(Transformer(cfg.replace(mlp="gelu_exact")), prep, "model")}
        cpu = {k: statistics.median(c for _, c in v) for k, v in run_interleaved(loops, steps).items()}
        print(f"  {name}: mlp=gelu {cpu['gelu'] * 1e3:.1f} ms, mlp=gelu_exact "
              f"{cpu['gelu_exact'] * 1e3:.1f} ms CPU a step ({torch.get_num_threads()} threads): "
              f"{cpu['gelu'] / cpu['gelu_exact']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="12,64,512")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--train", default="", help="presets for the training A/B, e.g. encoder")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    if args.train:
        train_ab(args.train.split(","), args.steps)
        return
    torch.set_num_threads(1)
    shape = tuple(int(s) for s in args.shape.split(","))
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"1 thread, shape {shape}")
    for name, fn in ACTIVATIONS.items():
        f, b = time_activation(fn, shape, args.reps)
        print(f"  {name:<24} forward {f * 1e3:7.3f} ms  backward {b * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
