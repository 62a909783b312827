"""Transformer: decoder-only (GPT), encoder-only (BERT) or encoder-decoder (2017), from a ModelConfig.

Losses live outside the model: ``F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
ignore_index=-100)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttnContext
from .blocks import LayerCache, Stack, dropout_or_none
from .config import ModelConfig
from .mlp import MLMTransform
from .norms import build_norm
from .positions import Position, build_position
from .variants import ARCHS

# Masked scores get this instead of -inf: finite in fp16/bf16 too, so a row whose keys are
# all padding gives a harmless uniform average instead of NaN.
MASK_VALUE = -3.0e4


def build_context(batch: int, q_pos: torch.Tensor, k_len: int, causal: bool,
                  key_keep: torch.Tensor | None,
                  bias: torch.Tensor | None) -> AttnContext:
    """The context of ``batch`` sequences whose queries sit at ``q_pos`` and whose keys number
    ``k_len``: one additive mask from causality, key padding (bool [B, Tk], True = real token)
    and a positional bias ([H, Tq, Tk], ALiBi). Without any of them SDPA's own causal path is
    used."""
    q_len = q_pos.shape[0]
    if bias is None and key_keep is None and not (causal and q_len != k_len):
        return AttnContext(batch, q_len, k_len, mask=None, is_causal=causal)
    k_pos = torch.arange(k_len, device=q_pos.device)
    allowed = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q_pos.device)
    if causal:
        allowed = allowed & (k_pos[None, :] <= q_pos[:, None])[None, None]
    if key_keep is not None:
        allowed = allowed & key_keep.bool()[:, None, None, :]
    base = torch.zeros((), device=q_pos.device) if bias is None else bias[None].float()
    mask = torch.where(allowed, base, torch.tensor(MASK_VALUE, device=q_pos.device))
    return AttnContext(batch, q_len, k_len, mask=mask)


class DecodeCache:
    """State for incremental decoding: per-layer KV caches, decoder key padding, and (enc-dec)
    the encoder output with its padding mask, computed once."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.key_keep: torch.Tensor | None = None  # [B, T_past] bool
        self.memory: torch.Tensor | None = None
        self.src_keep: torch.Tensor | None = None

    @property
    def offset(self) -> int:
        """Number of positions already in the cache (the next token's position)."""
        return self.layers[0].self_attn.length if self.layers else 0

    def reset_self(self) -> None:
        """Forget the decoder's own past; keep the encoder output and its cross-attention K/V."""
        for layer in self.layers:
            layer.self_attn.k = layer.self_attn.v = None
        self.key_keep = None


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        assert cfg.vocab_size is not None and cfg.d_model is not None
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # shared by src, tgt (2017)
        self.pos: Position = build_position(cfg)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.drop = dropout_or_none(cfg)
        self.is_seq2seq = ARCHS[cfg.arch].cross
        self.encoder = Stack(cfg, cfg.encoder_layers, cross=False) if cfg.encoder_layers else None
        self.decoder = (Stack(cfg, cfg.decoder_layers, cross=self.is_seq2seq)
                        if cfg.decoder_layers else None)
        # The stack that reads input_ids and feeds the output layer.
        self.causal = self.decoder is not None
        # BERT's extras (cfg.embed_norm, cfg.mlm_head); None keeps the state_dict keys unchanged
        self.embed_norm = build_norm(cfg) if cfg.embed_norm else None
        self.mlm_transform = MLMTransform(cfg) if cfg.mlm_head else None
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.mlm_head)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        # µP: logits * 1/m, so the output layer's updates do not grow the logits with width
        self.output_mult = 1.0 / cfg.width_multiplier
        self.reset_parameters()

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each block's activations in backward instead of storing them (training
        only; same loss and gradients). Parameters and state_dict keys are unchanged."""
        for stack in (self.encoder, self.decoder):
            if stack is not None:
                stack.checkpointing = bool(enabled)

    def set_block_regions(self, enabled: bool = True) -> None:
        """Under ``torch.compile``, trace one block and reuse its compiled code for every layer
        (``torch.compiler.nested_compile_region``): compiling takes a fraction of the time, at
        the cost of the fusions across block boundaries. Eager forwards are unchanged."""
        from scalelab.model.blocks import BLOCK_REGIONS_AVAILABLE

        if enabled and not BLOCK_REGIONS_AVAILABLE:
            raise ValueError(f"compiling one block for every layer needs torch >= 2.8 "
                             f"(torch.compiler.nested_compile_region); this is {torch.__version__}")
        for stack in (self.encoder, self.decoder):
            if stack is not None:
                stack.block_regions = bool(enabled)

    # --- init ----------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, init_std) weights, zero biases, unit norm gains; the residual
        out-projections (attention out, MLP down) get init_std / sqrt(2 * n_layers_total),
        so the residual stream's variance does not grow with depth. n_layers_total counts
        encoder and decoder blocks. Under µP the hidden matrices (every Linear but the output
        layer) are further divided by sqrt(m), so their variance goes as 1/fan_in."""
        cfg = self.cfg
        hidden_std = cfg.init_std / math.sqrt(cfg.width_multiplier)
        res_std = hidden_std / math.sqrt(2 * cfg.n_layers_total) if cfg.scale_residual_init \
            else hidden_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                std = res_std if getattr(m, "residual_out", False) else hidden_std
                if m is self.lm_head:
                    std = cfg.init_std  # µP: an output layer, scaled by output_mult instead
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=cfg.init_std)

    # --- forward -------------------------------------------------------------------------
    def _embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(ids)
        if self.embed_scale != 1.0:  # a multiply (and its backward) only where it changes x
            x = x * self.embed_scale
        x = self.pos.embed(x, pos)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return x if self.drop is None else self.drop(x)

    def encode(self, src_ids: torch.Tensor,
               src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output [B, S, d] (bidirectional, source padding masked as keys)."""
        assert self.encoder is not None
        b, s = src_ids.shape
        self.pos.check_length(s, "source of length %d", s)
        pos = torch.arange(s, device=src_ids.device)
        ctx = build_context(b, pos, s, causal=False, key_keep=src_mask, bias=self.pos.bias(pos, pos))
        ctx.rotary = self.pos.rotary(pos)
        return self.encoder(self._embed(src_ids, pos).view(b * s, -1), ctx).view(b, s, -1)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None,
                src_ids: torch.Tensor | None = None,
                src_mask: torch.Tensor | None = None,
                cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits [B, T, V].

        input_ids: [B, T] tokens (decoder: the sequence; encoder: the (masked) sequence;
        enc-dec: the shifted target). attention_mask: bool [B, T], True = real token (keys
        that are False are ignored). src_ids/src_mask: the source of an encoder-decoder.
        cache: a DecodeCache from new_cache() for incremental decoding (decoders only).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        memory = src_keep = None
        if self.is_seq2seq:
            if cache is not None and cache.memory is not None:
                memory, src_keep = cache.memory, cache.src_keep
            elif src_ids is None:
                raise ValueError("arch=encoder_decoder needs src_ids (the source tokens)")
            else:
                memory, src_keep = self.encode(src_ids, src_mask), src_mask
                if cache is not None:
                    cache.memory, cache.src_keep = memory, src_mask
        elif src_ids is not None:
            raise ValueError(f"src_ids is only used with arch=encoder_decoder, not {self.cfg.arch!r}")
        if cache is not None and not self.causal:
            raise ValueError("a KV cache needs a decoder (arch=decoder or encoder_decoder)")

        stack = self.decoder if self.decoder is not None else self.encoder
        assert stack is not None
        b, t = input_ids.shape
        offset = 0 if cache is None else cache.offset
        self.pos.check_length(offset + t, "input of length %d at offset %d", t, offset)
        pos = torch.arange(offset, offset + t, device=input_ids.device)
        key_keep = attention_mask
        if cache is not None and (attention_mask is not None or cache.key_keep is not None):
            # keys now span past + new tokens: extend the padding mask to match
            past = cache.key_keep if cache.key_keep is not None else torch.ones(
                b, offset, dtype=torch.bool, device=input_ids.device)
            new = attention_mask if attention_mask is not None else torch.ones(
                b, t, dtype=torch.bool, device=input_ids.device)
            key_keep = cache.key_keep = torch.cat([past, new.bool()], dim=1)
        k_pos = pos if offset == 0 else torch.arange(offset + t, device=input_ids.device)
        ctx = build_context(b, pos, offset + t, causal=self.causal, key_keep=key_keep,
                            bias=self.pos.bias(pos, k_pos))
        ctx.rotary = self.pos.rotary(pos)
        cross_ctx = None
        if memory is not None:
            cross_ctx = build_context(b, pos, memory.shape[1], causal=False, key_keep=src_keep, bias=None)
            memory = memory.flatten(0, 1)
        # the stacks work on rows [B * T, d] (attention.py says why)
        x = stack(self._embed(input_ids, pos).view(b * t, -1), ctx,
                  None if cache is None else cache.layers, memory, cross_ctx)
        if self.mlm_transform is not None:
            x = self.mlm_transform(x)
        logits = self.lm_head(x).view(b, t, -1)
        return logits if self.output_mult == 1.0 else logits * self.output_mult

    # --- decoding ------------------------------------------------------------------------
    def new_cache(self) -> DecodeCache:
        if self.decoder is None:
            raise ValueError("a KV cache needs a decoder (arch=decoder or encoder_decoder)")
        return DecodeCache(len(self.decoder.blocks))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, *,
                 src_ids: torch.Tensor | None = None,
                 src_mask: torch.Tensor | None = None,
                 eos_token_id: int | None = None,
                 vocab_limit: int | None = None) -> torch.Tensor:
        """Append up to max_new_tokens sampled tokens to input_ids [B, T]; returns [B, T + n].

        temperature=0 is greedy. Uses the KV cache; once the context holds max_seq_len tokens
        it keeps the last max_seq_len (as nanoGPT crops), re-filling the cache each step.
        After eos_token_id a row keeps emitting eos; all rows done -> stop early.
        vocab_limit: sample only ids below it (the tokenizer's vocabulary): the rows a padded
        vocabulary adds are no tokens, and an untrained model would otherwise emit them.
        """
        if not self.causal:
            raise ValueError("generate needs arch=decoder or encoder_decoder, not 'encoder'")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 0")
        was_training = self.training
        self.eval()
        window = self.cfg.max_seq_len
        ids = input_ids
        cache = self.new_cache()
        logits = self(ids[:, -window:], src_ids=src_ids, src_mask=src_mask, cache=cache)[:, -1]
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        for step in range(max_new_tokens):
            nxt = sample_next(logits[:, :vocab_limit], temperature, top_k)
            if eos_token_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
                done |= nxt == eos_token_id
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            if step == max_new_tokens - 1 or (eos_token_id is not None and bool(done.all())):
                break
            if cache.offset >= window:  # context full: slide the window, refill the cache
                cache.reset_self()
                logits = self(ids[:, -window:], cache=cache)[:, -1]
            else:
                logits = self(nxt[:, None], cache=cache)[:, -1]
        self.train(was_training)
        return ids


def sample_next(logits: torch.Tensor, temperature: float = 1.0,
                top_k: int | None = None) -> torch.Tensor:
    """One token per row from logits [B, V]: greedy if temperature == 0, else top-k sampling."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1)[:, 0]
