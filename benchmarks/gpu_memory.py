"""Peak GPU memory of one GPT-2 124M training step, with and without activation checkpointing.

    python -m benchmarks.gpu_memory [--batch 16] [--seq 1024] [--json out.json]

One forward and backward under bf16 autocast (the GPU bench's precision), at the GPU bench's
shape, on the same weights and batch both ways: the peak allocated memory above what the weights
and the batch hold (the gradients, 0.46 GiB in fp32, are inside both peaks), the loss of each,
and the largest gradient difference.
Without a CUDA device it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def step_peak(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, float, torch.Tensor]:
    """(peak bytes above the memory held before the step, loss, flat gradient) of one step."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks both ways
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), x.flatten())
    loss.backward()
    torch.cuda.synchronize()
    grad = torch.cat([p.grad.flatten().float() for p in model.parameters()])
    return torch.cuda.max_memory_allocated() - base, float(loss), grad


def bench(batch: int, seq: int) -> dict[str, Any]:
    from scalelab.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(max_seq_len=seq)  # the defaults are GPT-2 small
    model = Transformer(cfg).cuda()
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    out: dict[str, Any] = {"shape": f"GPT-2 124M, batch {batch} x {seq}, bf16 autocast",
                           "device": torch.cuda.get_device_name(0)}
    grads = {}
    for ac in (False, True):
        model.set_activation_checkpointing(ac)
        step_peak(model, x)  # warm-up: cuBLAS workspaces and kernels are not activations
        peak, loss, grads[ac] = step_peak(model, x)
        key = "checkpointed" if ac else "plain"
        out[f"peak_bytes_{key}"], out[f"loss_{key}"] = peak, loss
    out["ratio"] = out["peak_bytes_checkpointed"] / out["peak_bytes_plain"]
    out["max_grad_diff"] = float((grads[True] - grads[False]).abs().max())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_memory: no CUDA device here", file=sys.stderr)
        return 2
    r = bench(args.batch, args.seq)
    print(f"activation checkpointing ({r['shape']}, {r['device']}): step peak "
          f"{r['peak_bytes_plain'] / 2**30:.2f} -> {r['peak_bytes_checkpointed'] / 2**30:.2f} GiB "
          f"({r['ratio']:.2f}x); loss {r['loss_plain']:.4f} vs {r['loss_checkpointed']:.4f}, "
          f"max |grad diff| {r['max_grad_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
