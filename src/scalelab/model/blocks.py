"""Residual wrappers (pre-/post-LN, chosen by name: ``norm_position``) and the transformer blocks
built from them. A wrapper is a class in RESIDUAL_CLASSES plus its row in variants.NORM_POSITIONS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import AttnContext, CrossAttention, KVCache, SelfAttention
from .config import ModelConfig
from .mlp import build_mlp
from .norms import build_norm
from .variants import NORM_POSITIONS, check_registry


def dropout_or_none(cfg: ModelConfig) -> nn.Dropout | None:
    """None when dropout is off (the usual pre-training setting): callers then skip the call
    instead of running an identity module."""
    return nn.Dropout(cfg.dropout) if cfg.dropout else None


class PreNorm(nn.Module):
    """x + dropout(F(norm(x))) (GPT-2, Llama): the residual stream is never normalized, so
    gradients flow straight through; the stack then needs a final norm."""

    def __init__(self, cfg: ModelConfig, fn: nn.Module) -> None:
        super().__init__()
        self.norm, self.fn, self.drop = build_norm(cfg), fn, dropout_or_none(cfg)

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        y = self.fn(self.norm(x), *args)
        return x + (y if self.drop is None else self.drop(y))


class PostNorm(nn.Module):
    """norm(x + dropout(F(x))) (Vaswani et al. 2017, BERT): the output is already normalized."""

    def __init__(self, cfg: ModelConfig, fn: nn.Module) -> None:
        super().__init__()
        self.norm, self.fn, self.drop = build_norm(cfg), fn, dropout_or_none(cfg)

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        y = self.fn(x, *args)
        return self.norm(x + (y if self.drop is None else self.drop(y)))


RESIDUAL_CLASSES: dict[str, type[nn.Module]] = {"pre": PreNorm, "post": PostNorm}
check_registry("norm_position", RESIDUAL_CLASSES, NORM_POSITIONS)


class LayerCache:
    """KV caches of one block: its self-attention and (decoder of enc-dec) cross-attention."""

    def __init__(self) -> None:
        self.self_attn = KVCache()
        self.cross_attn = KVCache()


class Block(nn.Module):
    """Self-attention then MLP, each inside a residual wrapper (encoder / decoder-only block).

    Takes and returns rows [B * T, d], as every layer of a stack (attention.py says why), so
    forward hooks on blocks and sublayers see that shape; ``ctx.batch`` and ``ctx.q_len`` give
    B and T back."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        wrap = RESIDUAL_CLASSES[cfg.norm_position]
        self.self_attn = wrap(cfg, SelfAttention(cfg))
        self.mlp = wrap(cfg, build_mlp(cfg))

    def forward(self, x: torch.Tensor, ctx: AttnContext, cache: LayerCache | None = None,
                memory: torch.Tensor | None = None, cross_ctx: AttnContext | None = None,
                ) -> torch.Tensor:
        # The residual wrappers are entered through .forward, not nn.Module.__call__: they only
        # pair a norm with its sublayer (and name their state_dict keys), so hooks go on the
        # sublayers and tiny models skip two module calls a block.
        x = self.self_attn.forward(x, ctx, None if cache is None else cache.self_attn)
        return self.mlp.forward(x)


class CrossBlock(Block):
    """Decoder block of an encoder-decoder: self-attention, cross-attention, MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.cross_attn = RESIDUAL_CLASSES[cfg.norm_position](cfg, CrossAttention(cfg))

    def forward(self, x: torch.Tensor, ctx: AttnContext, cache: LayerCache | None = None,
                memory: torch.Tensor | None = None, cross_ctx: AttnContext | None = None,
                ) -> torch.Tensor:
        x = self.self_attn.forward(x, ctx, None if cache is None else cache.self_attn)
        x = self.cross_attn.forward(x, cross_ctx, memory, None if cache is None else cache.cross_attn)
        return self.mlp.forward(x)  # the wrappers' .forward: see Block.forward


class Stack(nn.Module):
    """n blocks plus an optional final norm (on by default for pre-LN), over rows [B * T, d]."""

    def __init__(self, cfg: ModelConfig, n_layers: int, cross: bool) -> None:
        super().__init__()
        block = CrossBlock if cross else Block
        self.blocks = nn.ModuleList([block(cfg) for _ in range(n_layers)])
        self.final_norm = build_norm(cfg) if cfg.final_norm else nn.Identity()
        # Activation checkpointing: keep only each block's input for backward and recompute
        # its inside (about 1/3 more compute for a fraction of the activation memory).
        self.checkpointing = False
        # Under torch.compile: trace one block and reuse its compiled code for every layer
        # (Transformer.set_block_regions). Eager forwards are unaffected.
        self.block_regions = False

    def forward(self, x: torch.Tensor, ctx: AttnContext,
                caches: list[LayerCache] | None = None,
                memory: torch.Tensor | None = None,
                cross_ctx: AttnContext | None = None) -> torch.Tensor:
        # One loop per way of running the blocks, so the loop body makes no decisions.
        if caches is not None:  # decoding: each block has its KV cache
            for block, cache in zip(self.blocks, caches, strict=True):
                x = block(x, ctx, cache, memory, cross_ctx)
        elif self.checkpointing and self.training and torch.is_grad_enabled():
            for block in self.blocks:
                x = checkpoint(block, x, ctx, None, memory, cross_ctx, use_reentrant=False)
        elif self.block_regions:
            for block in self.blocks:
                x = _block_region(block, x, ctx, None, memory, cross_ctx)
        else:
            for block in self.blocks:
                x = block(x, ctx, None, memory, cross_ctx)
        return self.final_norm(x)


def _call_block(block: nn.Module, x: torch.Tensor, ctx: AttnContext, cache: LayerCache | None,
                memory: torch.Tensor | None, cross_ctx: AttnContext | None) -> torch.Tensor:
    return block(x, ctx, cache, memory, cross_ctx)


# torch >= 2.8; a no-op outside torch.compile
_nested_region = getattr(torch.compiler, "nested_compile_region", None)
_block_region = _nested_region(_call_block) if _nested_region is not None else _call_block
BLOCK_REGIONS_AVAILABLE = _nested_region is not None
