"""A minimal transformer written the way a hand-written training script would write it.

The yardstick of the training bench: one fused QKV projection, SDPA, nothing configurable beyond
what the bench presets need (GPT-2 and Llama decoders, a BERT-style encoder). It reads the
shape from a scalelab ``ModelConfig`` so both sides train exactly the same architecture.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.model import ModelConfig


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.nh, self.nkv, self.hd = cfg.n_heads, cfg.kv_heads, hd
        self.causal, self.pre = cfg.arch == "decoder", cfg.norm_position == "pre"
        self.ln1, self.ln2 = _norm(cfg), _norm(cfg)
        self.qkv = nn.Linear(d, (self.nh + 2 * self.nkv) * hd, bias=cfg.bias)
        self.proj = nn.Linear(d, d, bias=cfg.bias)
        d_ff = cfg.d_ff or 4 * d
        self.swiglu = cfg.mlp == "swiglu"
        self.fc = nn.Linear(d, (2 if self.swiglu else 1) * d_ff, bias=cfg.bias)
        self.out = nn.Linear(d_ff, d, bias=cfg.bias)
        self.act = cfg.mlp

    def attn(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = q.view(b, t, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
        if rope is not None:
            q, k = _rope(q, *rope), _rope(k, *rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           enable_gqa=self.nkv != self.nh)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.swiglu:
            g, u = h.chunk(2, dim=-1)
            return self.out(F.silu(g) * u)
        if self.act == "relu":
            return self.out(F.relu(h))
        return self.out(F.gelu(h, approximate="none" if self.act == "gelu_exact" else "tanh"))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.ln1(x), rope)
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x, rope))
        return self.ln2(x + self.mlp(x))


class ReferenceLM(nn.Module):
    """GPT / Llama decoder or BERT-style encoder (no padding mask) from a ModelConfig."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.arch not in ("decoder", "encoder") or cfg.position not in ("learned", "rope"):
            raise ValueError(f"reference model: no {cfg.arch} with {cfg.position} positions")
        assert cfg.vocab_size is not None
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.position == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = _norm(cfg) if cfg.norm_position == "pre" else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.wte.weight
        for name, p in self.named_parameters():  # GPT-2 init, as nanoGPT
            if p.dim() >= 2:
                std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if name.endswith(("proj.weight", "out.weight")) else cfg.init_std
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.wte(idx)
        rope = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device))
        else:
            hd = self.cfg.head_dim
            inv = self.cfg.rope_base ** (-torch.arange(0, hd, 2, device=idx.device).float() / hd)
            ang = torch.arange(t, device=idx.device).float()[:, None] * inv[None]
            ang = torch.cat([ang, ang], -1)
            rope = (ang.cos(), ang.sin())
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.ln_f(x))


def _reference_name(name: str) -> str | None:
    """The reference's name for one of a ``Transformer``'s block parameters (``blocks.<i>.`` cut
    off), or None for SwiGLU's gate, which the caller concatenates with ``up``. Matched by the
    last module name, so the fused projection may be called ``qkv`` or ``qkv_proj``."""
    module, _, param = name.rpartition(".")
    section, leaf = module.split(".")[0], module.split(".")[-1]
    if leaf == "norm":
        return f"{'ln1' if section == 'self_attn' else 'ln2'}.{param}"
    if section == "self_attn":
        return f"{'qkv' if 'qkv' in leaf else 'proj'}.{param}"
    return {"up": f"fc.{param}", "down": f"out.{param}", "gate": None}[leaf]


def state_from_transformer(model: nn.Module) -> dict[str, torch.Tensor]:
    """A ``Transformer``'s parameters in ``ReferenceLM``'s layout, so the reference can start
    from the platform's own initial draw. SwiGLU's gate and up go into the reference's ``fc``."""
    params = dict(model.named_parameters(remove_duplicate=False))  # tied: lm_head and tok_emb
    out: dict[str, torch.Tensor] = {}
    for key, value in params.items():
        name = key.removeprefix("decoder.").removeprefix("encoder.")
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            target = _reference_name(rest)
            if target is None:
                continue
            gate = params.get(key.replace(".up.", ".gate.")) if target.startswith("fc.") else None
            out[f"blocks.{i}.{target}"] = value if gate is None else torch.cat([gate, value])
        else:
            out[{"tok_emb.weight": "wte.weight", "pos.table.weight": "wpe.weight",
                 "lm_head.weight": "head.weight"}.get(name) or name.replace("final_norm", "ln_f")] = value
    return out
