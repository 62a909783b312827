# ruff: noqa: I001  (scalelab.cli sets the OpenMP policy: it must load before torch)
"""Forward and backward time of each MLP activation on this CPU.

    python -m benchmarks.activations [--shape 12,64,512] [--reps 50] [--threads 1] [--dtype bf16]
    python -m benchmarks.activations --train shakespeare_char,encoder [--steps 60]

``--train``: the bench's plain loop (scalelab's Transformer, the preset's batches and AdamW) with
``mlp: gelu`` through scalelab's kernel, the same through torch's, and ``mlp: gelu_exact``,
alternating step by step, CPU seconds per step.

The shape is the shakespeare_char MLP's hidden activation (batch 12, block 64, d_ff 512). Why it
exists: torch's CPU kernel for the tanh-approximate GELU (what ``mlp: gelu`` computes, as GPT-2
does) measured 3-4x slower than the exact erf GELU, on AVX2 and on AVX-512 CPUs, and the sum of
its forward and backward was a fifth of a shakespeare_char training step (docs/performance.md);
``mlp: gelu`` now runs scalelab's one-pass kernel (model/fast_gelu.py) where it builds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import scalelab.cli  # noqa: F401
import torch
import torch.nn.functional as F

from scalelab.model.fast_gelu import gelu_tanh

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu (tanh, scalelab's)": gelu_tanh,
    "gelu (tanh, torch's)": lambda t: F.gelu(t, approximate="tanh"),
    "gelu (exact erf)": F.gelu,
    "silu (swiglu's gate)": F.silu,
    "relu": F.relu,
}


def time_activation(fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...],
                    reps: int, dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """Median (forward, backward) seconds over ``reps`` calls."""
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    grad = torch.ones(*shape, dtype=dtype)
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
    """Training steps with the tanh GELU through scalelab's kernel and through torch's, and with
    the exact GELU, interleaved (bench_train's loop)."""
    from benchmarks.bench_train import PRESETS, PlainLoop, prepare_preset, run_interleaved
    from scalelab.model import Transformer

    for name in presets:
        prep = prepare_preset(PRESETS[name])
        cfg = prep["model_cfg"]
        models, torch_kernel = {}, "gelu, torch's kernel"
        for label, mlp in (("gelu", "gelu"), (torch_kernel, "gelu"), ("gelu_exact", "gelu_exact")):
            torch.manual_seed(0)
            models[label] = Transformer(cfg.replace(mlp=mlp))
        for module in models[torch_kernel].modules():
            if hasattr(module, "act"):  # this instance only: its GELU MLPs call torch's kernel
                module.act = lambda h: F.gelu(h, approximate="tanh")
        loops = {k: PlainLoop(m, prep, "model") for k, m in models.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in run_interleaved(loops, steps).items()}
        print(f"  {name} ({torch.get_num_threads()} threads), CPU ms a step: "
              + ", ".join(f"mlp={k} {v * 1e3:.1f}" for k, v in cpu.items())
              + f"; torch's kernel / scalelab's {cpu[torch_kernel] / cpu['gelu']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="12,64,512")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--train", default="", help="presets for the training A/B, e.g. encoder")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args()
    if args.train:
        train_ab(args.train.split(","), args.steps)
        return
    torch.set_num_threads(args.threads)
    shape = tuple(int(s) for s in args.shape.split(","))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), shape {shape}, {args.dtype}")
    for name, fn in ACTIVATIONS.items():
        f, b = time_activation(fn, shape, args.reps, dtype)
        print(f"  {name:<24} forward {f * 1e3:7.3f} ms  backward {b * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
