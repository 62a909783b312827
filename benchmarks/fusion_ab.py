# ruff: noqa: I001  (scalelab.cli sets the OpenMP policy: it must load before torch)
"""Separate vs fused projections, A/B in one process: CPU time per training step.

    python -m benchmarks.fusion_ab {gpt,llama,tiny,sweep_point} [steps] [--what qkv|gate_up]

The sides are the same ``Transformer`` (same init, same batch, fused AdamW, 1 thread) and
alternate step by step, so the shared machine's load hits both alike. ``qkv``: scalelab's one
``qkv_proj`` parameter (``fused``) against three Linears, one GEMM each (``separate``), and
against three Linears whose weights are concatenated for one GEMM at every step (``cat``: the
code before the parameter was fused). ``gate_up``: one GEMM for SwiGLU's gate and up, split with
``chunk`` (tried and dropped, see docs/performance.md), against scalelab's two GEMMs.
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
    "sweep_point": ({"vocab_size": 101, "max_seq_len": 64, "d_model": 12, "n_layers": 2, "n_heads": 3}, 6),
}


class _Parts(torch.nn.Module):
    """q, k and v as three Linears, cut from a fused ``qkv_proj`` (same values)."""

    def __init__(self, fused: torch.nn.Linear, splits: tuple[int, ...]) -> None:
        super().__init__()
        self.splits = splits
        ws = fused.weight.detach().split(splits)
        bs = (None,) * 3 if fused.bias is None else fused.bias.detach().split(splits)
        self.q, self.k, self.v = (torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
                                  for w, b in zip(ws, bs, strict=True))
        for lin, w, b in zip((self.q, self.k, self.v), ws, bs, strict=True):
            lin.weight.data.copy_(w)
            if b is not None:
                lin.bias.data.copy_(b)


def _separate_qkv(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return self.parts.q(x), self.parts.k(x), self.parts.v(x)


def _cat_qkv(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q, k, v = self.parts.q, self.parts.k, self.parts.v
    bias = None if q.bias is None else torch.cat([q.bias, k.bias, v.bias])
    return F.linear(x, torch.cat([q.weight, k.weight, v.weight]), bias).split(self.splits, dim=-1)


def _unfuse(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, attn.SelfAttention):
            m.parts = _Parts(m.qkv_proj, m.splits)
            del m.qkv_proj


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
    fused_qkv, separate_mlp = attn.SelfAttention.qkv, mlp.GatedMLP.forward
    patches = {"separate": (_separate_qkv, separate_mlp), "cat": (_cat_qkv, separate_mlp),
               "fused": (fused_qkv, separate_mlp)}
    if args.what == "gate_up":
        patches = {"separate": (fused_qkv, separate_mlp), "fused": (fused_qkv, _fused_gate_up)}
    sides = {}
    for name in patches:
        torch.manual_seed(0)
        model = Transformer(cfg)
        if args.what == "qkv" and name != "fused":
            _unfuse(model)
        sides[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1))
    times: dict[str, list[float]] = {k: [] for k in sides}
    losses: dict[str, float] = {}
    order = list(sides)
    for k in range(args.steps):
        for name in order[k % len(order):] + order[:k % len(order)]:  # rotate who goes first
            attn.SelfAttention.qkv, mlp.GatedMLP.forward = patches[name]  # type: ignore[method-assign]
            model, opt = sides[name]
            c0 = time.process_time()
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if k >= 10:
                times[name].append(time.process_time() - c0)
            losses[name] = loss.item()
    attn.SelfAttention.qkv, mlp.GatedMLP.forward = fused_qkv, separate_mlp  # type: ignore[method-assign]
    med = {name: statistics.median(t) for name, t in times.items()}
    fus = med["fused"]
    print(f"{args.shape} {args.what}: " + ", ".join(
        f"{name} {1e3 * t:.2f} ms" for name, t in med.items()) + " CPU/step; fused speed-up "
        + ", ".join(f"{t / fus:.3f}x vs {name}" for name, t in med.items() if name != "fused")
        + " (last losses " + " / ".join(f"{v:.5f}" for v in losses.values()) + ")")

if __name__ == "__main__":
    main()
