"""GPU MFU levers for GPT-2 124M in a plain compiled loop, side by side in one process.

    python -m benchmarks.gpu_levers [--steps 20] [--json out.json]
    python -m benchmarks.gpu_levers --cpu-smoke     # the plumbing on a tiny model, eager, on CPU

Each variant is scalelab's ``Transformer`` (GPT-2 small at sequence 1024) with fused AdamW, norm
clipping at 1.0 and bf16 autocast, compiled; it adds one lever to the variant before it:

    baseline        vocabulary 50,260 (r50k_base + 3 specials), batch 16, loss outside the graph
    vocab 50304     the output layer padded to a multiple of 128 (tensor-core aligned rows)
    loss in graph   the cross-entropy compiled with the forward (no fp32 logits in memory)
    batch 32        twice the tokens per step
    blocks once     one block traced and compiled for all 12 (Transformer.set_block_regions):
                    the cold start it saves against the per-step cost of unfused block edges

The variants are compiled first (each one's first step, compile included, is its cold start),
then step in turn (A B C D A B C D ...), so the machine's drift hits them alike. Reported per
variant: median ms per step, tokens/s, and MFU: tokens/s x the config's exact FLOPs per token
(``ModelConfig.flops_per_token``) / the GPU's bf16 peak (``scalelab.training.perf``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"vocab": 50260, "batch": 16, "loss_in_graph": False},
    "vocab 50304": {"vocab": 50304, "batch": 16, "loss_in_graph": False},
    "loss in graph": {"vocab": 50304, "batch": 16, "loss_in_graph": True},
    "batch 32": {"vocab": 50304, "batch": 32, "loss_in_graph": True},
    "blocks once": {"vocab": 50304, "batch": 32, "loss_in_graph": True, "block_regions": True},
}


class Variant:
    """One model, its optimizer and a fixed batch; ``step`` is one training step."""

    def __init__(self, vocab: int, batch: int, loss_in_graph: bool, block_regions: bool = False, *,
                 seq: int, device: str, compile: bool, dims: dict[str, int]) -> None:
        from scalelab.model import ModelConfig, Transformer

        torch.manual_seed(0)
        self.cfg = ModelConfig(vocab_size=vocab, max_seq_len=seq, **dims)
        self.model = Transformer(self.cfg).to(device)
        self.model.set_block_regions(block_regions)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        rest = [p for p in self.model.parameters() if p.ndim < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=6e-4, betas=(0.9, 0.95), fused=device == "cuda")
        # the tokens a tokenizer of 50,260 ids can produce, whatever the padded vocabulary
        self.x = torch.randint(0, 50260, (batch, seq + 1), device=device)
        self.tokens, self.device, self.loss_in_graph = batch * seq, device, loss_in_graph
        forward = torch.compile(self.model, dynamic=False) if compile else self.model
        self.forward = forward
        self.loss = torch.compile(self._loss, dynamic=False) if compile and loss_in_graph else self._loss

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x) if self.loss_in_graph else self.forward(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def step(self) -> None:
        x, y = self.x[:, :-1], self.x[:, 1:]
        with torch.autocast(self.device, dtype=torch.bfloat16):
            loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def timed_step(self) -> float:
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        self.step()
        sync()
        return time.perf_counter() - t0


def bench(steps: int, smoke: bool = False, log: Any = print) -> dict[str, Any]:
    from scalelab.training.perf import peak_flops

    device = "cpu" if smoke else "cuda"
    dims = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64} if smoke else {}
    seq = 16 if smoke else 1024
    peak = None if smoke else peak_flops("cuda", "bf16-mixed")
    runs: dict[str, Variant] = {}
    res: dict[str, Any] = {"device": "cpu (smoke)" if smoke else torch.cuda.get_device_name(0),
                           "peak_flops": peak, "steps": steps, "variants": {}}
    for name, v in VARIANTS.items():
        runs[name] = Variant(**v, seq=seq, device=device, compile=not smoke, dims=dims)
        cold = runs[name].timed_step()
        res["variants"][name] = {**v, "params": runs[name].cfg.n_params(), "cold_start_s": cold}
        log(f"  {name}: first step (compile) {cold:.1f} s")
    times: dict[str, list[float]] = {k: [] for k in runs}
    for k in range(steps + 3):
        for name, run in runs.items():
            dt = run.timed_step()
            if k >= 3:  # the autotuner and allocator settle in the first steps after compiling
                times[name].append(dt)
    base = statistics.median(times["baseline"]) / runs["baseline"].tokens
    for name, run in runs.items():
        ms = statistics.median(times[name])
        out = res["variants"][name]
        out["ms_per_step"] = 1000 * ms
        out["tokens_per_s"] = run.tokens / ms
        out["speedup_per_token"] = base / (ms / run.tokens)
        fpt = run.cfg.flops_per_token(seq_len=seq)
        out["mfu"] = out["tokens_per_s"] * fpt / peak if peak else None
        mfu = f"MFU {out['mfu']:.1%}" if peak else "MFU -"
        log(f"  levers {name:<14} {out['ms_per_step']:8.1f} ms/step {out['tokens_per_s']:>11,.0f} tok/s "
            f"x{out['speedup_per_token']:.2f}  {mfu}  first step {out['cold_start_s']:.1f} s")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_levers", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant (after 3 warm-up)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model, eager, on CPU: checks the script")
    args = ap.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_levers: no CUDA device here (use --cpu-smoke to check the script)", file=sys.stderr)
        return 2
    res = bench(args.steps, smoke=args.cpu_smoke)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
