# ruff: noqa: I001  (scalelab.cli sets the OpenMP policy: it must load before torch)
"""Separate vs fused projections, A/B in one process: CPU time per training step.

    python -m benchmarks.fusion_ab {gpt,llama,tiny} [steps] [--what qkv|gate_up]

The two sides are the same ``Transformer`` (same init, same batch, fused AdamW, 1 thread) and
alternate step by step, so the shared machine's load hits both alike. ``qkv``: scalelab's fused
q/k/v GEMM (``SelfAttention._qkv``) against three separate projections. ``gate_up``: one GEMM for
SwiGLU's gate and up, split with ``chunk`` (tried and dropped, see docs/performance.md), against
scalelab's two GEMMs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import scalelab.cli  # noqa: F401
import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig, Transformer
from scalelab.model import attention as attn
from scalelab.model import mlp

SHAPES: dict[str, tuple[dict[str, Any], int]] = {  # (model, batch)
    "gpt": ({"vocab_size": 69, "max_seq_len": 64, "d_model": 128, "n_layers": 4, "n_heads": 4}, 12),
    "llama": ({"vocab_size": 260, "max_seq_len": 128, "d_model": 128, "n_layers": 4, "n_heads": 4,
               "n_kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
               "bias": False}, 16),
    "tiny": ({"vocab_size": 69, "max_seq_len": 64, "d_model": 12, "n_layers": 1, "n_heads": 3}, 19),
}


def _separate_qkv(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def _fused_gate_up(self: Any, x: torch.Tensor) -> torch.Tensor:
    weight = torch.cat([self.gate.weight, self.up.weight])
    bias = None if self.gate.bias is None else torch.cat([self.gate.bias, self.up.bias])
    g, u = F.linear(x, weight, bias).chunk(2, dim=-1)
    return self.down(self.act(g) * u)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=SHAPES)
    ap.add_argument("steps", type=int, nargs="?", default=150)
    ap.add_argument("--what", choices=("qkv", "gate_up"), default="qkv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_kw, batch = SHAPES[args.shape]
    cfg = ModelConfig.from_dict({"arch": "decoder", "dropout": 0.0, **model_kw})
    fused_qkv, separate_mlp = attn.SelfAttention._qkv, mlp.GatedMLP.forward
    patches = {"separate": (_separate_qkv, separate_mlp), "fused": (fused_qkv, separate_mlp)}
    if args.what == "gate_up":
        patches = {"separate": (fused_qkv, separate_mlp), "fused": (fused_qkv, _fused_gate_up)}
    sides = {}
    for name in patches:
        torch.manual_seed(0)
        model = Transformer(cfg)
        for m in model.modules():  # the fused side fuses whatever the position scheme
            if isinstance(m, attn.SelfAttention):
                m.fuse_qkv = True
        sides[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1))
    times: dict[str, list[float]] = {k: [] for k in sides}
    losses: dict[str, float] = {}
    for k in range(args.steps):
        for name in ("separate", "fused") if k % 2 else ("fused", "separate"):
            attn.SelfAttention._qkv, mlp.GatedMLP.forward = patches[name]  # type: ignore[method-assign]
            model, opt = sides[name]
            c0 = time.process_time()
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if k >= 10:
                times[name].append(time.process_time() - c0)
            losses[name] = loss.item()
    attn.SelfAttention._qkv, mlp.GatedMLP.forward = fused_qkv, separate_mlp  # type: ignore[method-assign]
    sep, fus = statistics.median(times["separate"]), statistics.median(times["fused"])
    print(f"{args.shape} {args.what}: separate {1e3 * sep:.2f} ms, fused {1e3 * fus:.2f} ms CPU/step: "
          f"fused speed-up {sep / fus:.3f}x (last losses {losses['separate']:.5f} / {losses['fused']:.5f})")


if __name__ == "__main__":
    main()
