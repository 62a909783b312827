"""ModelConfig: the single source of truth for a transformer's shape.

Validation, the exact parameter count and the FLOPs per token all derive from this
dataclass and the variant tables in variants.py (no torch import, no allocation), so a
GPT-3-sized shape can be accounted for on a laptop. Its defaults are the source of every
preset's unlisted fields: the Hydra presets in ``conf/model/*.yaml`` list only what differs
(they are generated from presets.py), and the train schema fills in the rest from here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from . import accounting
from .accounting import Component
from .variants import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS

# standard: one lr and the GPT-2 init; mup: µP relative to mup_base_width (see the field)
PARAMETRIZATIONS = ("standard", "mup")
# How attention is computed (model/attention.py); the result, the parameters and the FLOPs are
# the same either way.
ATTENTIONS: dict[str, str] = {
    "sdpa": "F.scaled_dot_product_attention",
    "math": "plain torch ops: matmul, softmax, matmul",
}

__all__ = ["ARCHS", "ATTENTIONS", "MLPS", "NORMS", "NORM_POSITIONS", "PARAMETRIZATIONS",
           "POSITIONS", "Component", "ModelConfig"]


@dataclass
class ModelConfig:
    """Shape and variant choices of one transformer. All fields have defaults (GPT-2 small)."""

    # --- architecture -------------------------------------------------------------------
    arch: str = "decoder"  # decoder (GPT) | encoder (BERT) | encoder_decoder (2017 Transformer)
    # None so a Hydra preset can say `null` and let the tokenizer fill it in; it must be a
    # positive int by the time the config is built.
    vocab_size: int | None = 50257
    max_seq_len: int = 1024  # n_ctx: size of learned position table, default eval length
    d_model: int = 768
    n_layers: int = 12  # blocks per stack; enc-dec uses it for both stacks unless overridden
    n_encoder_layers: int | None = None  # encoder_decoder only (None -> n_layers)
    n_decoder_layers: int | None = None  # encoder_decoder only (None -> n_layers)
    n_heads: int = 12
    n_kv_heads: int | None = None  # GQA: None -> n_heads (MHA); 1 -> MQA
    attention: str = "sdpa"  # sdpa | math: how attention is computed (ATTENTIONS above)
    # --- feed-forward -------------------------------------------------------------------
    # None -> the mlp's rule in variants.MLPS: 4*d_model (gelu/relu); gated MLPs (swiglu) have
    # three matrices, so 8d/3 rounded UP to a multiple of ffn_multiple_of. 32 keeps tiny CPU
    # models within a few % of 8d^2 while giving GPU-friendly matmul shapes; Llama used 256
    # (set 256 to get d_ff=11008 at d=4096).
    d_ff: int | None = None
    ffn_multiple_of: int = 32
    mlp: str = "gelu"  # a key of variants.MLPS: gelu (tanh, GPT-2), gelu_exact, relu, swiglu, ...
    # --- normalization ------------------------------------------------------------------
    norm: str = "layernorm"  # a key of variants.NORMS: layernorm, rmsnorm, ...
    norm_position: str = "pre"  # pre: x + F(LN(x)) (GPT-2) | post: LN(x + F(x)) (2017, BERT)
    norm_eps: float = 1e-5
    final_norm: bool | None = None  # None -> True for pre-LN, False for post-LN
    # --- positions ----------------------------------------------------------------------
    position: str = "learned"  # a key of variants.POSITIONS: learned, sinusoidal, rope, alibi, none
    rope_base: float = 10000.0
    # --- misc ---------------------------------------------------------------------------
    bias: bool = True  # biases in linear layers and LayerNorm
    dropout: float = 0.0
    tie_embeddings: bool = True  # output layer shares the token embedding matrix
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (2017 paper)
    # --- BERT's extra pieces (off by default; Hugging Face's BertForMaskedLM always has them) --
    embed_norm: bool = False  # a norm on the summed embeddings, before the first block
    mlm_head: bool = False  # dense + GELU + norm before the output layer, and an output bias
    # --- initialization (GPT-2) ---------------------------------------------------------
    init_std: float = 0.02
    scale_residual_init: bool = True  # residual out-projections get std/sqrt(2*n_layers_total)
    # --- parametrization ----------------------------------------------------------------
    # standard: the init above and one learning rate for every matrix. mup (µP, Yang et al.
    # 2022, "Tensor Programs V"): with m = d_model / mup_base_width, hidden matrices get
    # init std / sqrt(m) and lr / m (Adam), the logits are multiplied by 1/m and attention
    # scores by sqrt(mup_base_head_dim) / head_dim (the 1/head_dim law, equal to standard at
    # the base width); an lr tuned at the base width then stays optimal as width grows.
    parametrization: str = "standard"  # standard | mup
    mup_base_width: int | None = None  # mup: the d_model the lr was tuned at
    # mup: head_dim of the model at mup_base_width. None -> mup_base_width / n_heads (heads fixed,
    # head_dim grows with width: scores shrink as 1/sqrt(m)). A family that fixes head_dim and
    # adds heads (the sweep's) sets its head_dim: the per-head dot product does not grow, so the
    # scale stays 1/sqrt(head_dim) at every width.
    mup_base_head_dim: int | None = None

    # ------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        # the values as given (before d_ff, n_kv_heads, final_norm are derived), for replace()
        self._given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, table in (("arch", ARCHS), ("norm", NORMS), ("norm_position", NORM_POSITIONS),
                            ("mlp", MLPS), ("position", POSITIONS),
                            ("parametrization", PARAMETRIZATIONS), ("attention", ATTENTIONS)):
            if getattr(self, name) not in table:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is unknown; "
                                 f"choose one of {', '.join(table)}")
        self._check_types()
        self._check_shape()
        self._check_mup()
        if self.d_ff is None:
            self.d_ff = self.default_d_ff()
        if self.final_norm is None:
            self.final_norm = NORM_POSITIONS[self.norm_position].final_norm

    def _check_types(self) -> None:
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads",
                     "ffn_multiple_of"):
            self._check_positive_int(name)
        for name in ("n_encoder_layers", "n_decoder_layers", "n_kv_heads", "d_ff"):
            if getattr(self, name) is not None:
                self._check_positive_int(name)
        for name in ("norm_eps", "init_std", "rope_base"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive number")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout={self.dropout!r}: must be in [0, 1)")
        for name in ("bias", "tie_embeddings", "scale_embeddings", "scale_residual_init",
                     "embed_norm", "mlm_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: must be true or false")
        if self.final_norm is not None and not isinstance(self.final_norm, bool):
            raise ValueError(f"ModelConfig.final_norm={self.final_norm!r}: must be true, false or null")

    def _check_shape(self) -> None:
        if not ARCHS[self.arch].cross:
            for name in ("n_encoder_layers", "n_decoder_layers"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"ModelConfig.{name}={getattr(self, name)!r}: only used with "
                        f"arch=encoder_decoder (arch={self.arch!r}); use n_layers instead")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                f"(head_dim = d_model / n_heads)")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} must be divisible by "
                f"n_kv_heads={self.n_kv_heads} (each K/V head serves n_heads/n_kv_heads query heads)")
        even = POSITIONS[self.position].even
        if even is not None and getattr(self, even) % 2:
            raise ValueError(
                f"ModelConfig.position={self.position!r} needs an even {even}, got "
                f"{even}={getattr(self, even)} (d_model={self.d_model}, n_heads={self.n_heads}); "
                f"{POSITIONS[self.position].why}")

    def _check_mup(self) -> None:
        if self.parametrization == "mup":
            if self.mup_base_width is None:
                raise ValueError(
                    "ModelConfig.parametrization='mup' needs mup_base_width: the d_model at which "
                    "the learning rate was tuned (e.g. model.mup_base_width=128)")
            self._check_positive_int("mup_base_width")
            if self.mup_base_head_dim is not None:
                self._check_positive_int("mup_base_head_dim")
            return
        for name in ("mup_base_width", "mup_base_head_dim"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r} is only used with "
                    "parametrization=mup; set model.parametrization=mup or drop it")

    def _check_positive_int(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            hint = " (set it from the tokenizer)" if name == "vocab_size" and value is None else ""
            raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive integer{hint}")

    def default_d_ff(self) -> int:
        """d_ff when it is null: the mlp's rule in variants.MLPS."""
        return MLPS[self.mlp].default_d_ff(self.d_model, self.ffn_multiple_of)

    # --- derived shape --------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def encoder_layers(self) -> int:
        """Blocks in the encoder stack (0 for a decoder-only model)."""
        if not ARCHS[self.arch].encoder:
            return 0
        return self.n_encoder_layers if self.n_encoder_layers is not None else self.n_layers

    @property
    def decoder_layers(self) -> int:
        """Blocks in the decoder stack (0 for an encoder-only model)."""
        if not ARCHS[self.arch].decoder:
            return 0
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def width_multiplier(self) -> float:
        """µP's m = d_model / mup_base_width; 1.0 under the standard parametrization."""
        if self.parametrization != "mup" or self.mup_base_width is None:
            return 1.0
        return self.d_model / self.mup_base_width

    @property
    def attn_score_scale(self) -> float:
        """Multiplier of q.k in attention: 1/sqrt(head_dim); under µP sqrt(base_head_dim) /
        head_dim, µP's 1/head_dim law with its constant set so that the base width gets the
        standard scale. With n_heads fixed this is 1/sqrt(head_dim * m); with head_dim fixed
        (base_head_dim = head_dim) it is the standard 1/sqrt(head_dim) at every width."""
        if self.parametrization != "mup" or self.mup_base_width is None:
            return 1.0 / math.sqrt(self.head_dim)
        base = self.mup_base_head_dim or self.mup_base_width / self.n_heads
        return math.sqrt(base) / self.head_dim

    @property
    def n_layers_total(self) -> int:
        return self.encoder_layers + self.decoder_layers

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed, re-deriving the defaults that were not given.

        Unlike ``dataclasses.replace`` (which would keep e.g. the old d_ff = 4 * old d_model),
        ``cfg.replace(d_model=256)`` gives d_ff = 1024 unless d_ff was set explicitly.
        """
        return ModelConfig.from_dict({**self._given, **changes})

    # --- (de)serialization ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(
                f"ModelConfig: unknown key(s) {unknown}; valid keys are {sorted(names)}")
        return cls(**dict(d))

    # --- exact accounting -----------------------------------------------------------------
    def breakdown(self) -> list[Component]:
        """Per-component parameter counts (and forward FLOPs/token), from the config alone.

        The sum over components equals ``sum(p.numel() for p in Transformer(cfg).parameters())``
        for every combination of options (tests/model/test_accounting.py checks a full grid).
        """
        return accounting.breakdown(self)

    def n_params(self, non_embedding: bool = False) -> int:
        """Total parameters N (tied weights once).

        non_embedding=True drops every vocab- or position-table-sized matrix: the token
        embedding, a learned position table, and an untied output layer (Kaplan et al. 2020).
        """
        skip = {"embedding", "head"} if non_embedding else set()
        return sum(c.total_params for c in self.breakdown() if c.kind not in skip)

    def n_params_matmul(self) -> int:
        """Parameters that take part in a matmul per token: non-embedding + the V*d output layer.

        The output layer is counted once, tied or not: tied, it is a lookup on the input
        side and a matmul on the output side.
        """
        return self.n_params(non_embedding=True) + self.vocab_size * self.d_model

    def attention_flops_per_token(self, seq_len: int | None = None) -> int:
        """Forward FLOPs/token of the attention scores (QK^T and AV): 2 * 2 * T * d per layer.

        Encoder-decoder, per target token, assuming the source is as long as the target
        (S = T): encoder self-attention 4*L_enc*T*d, decoder self-attention 4*L_dec*T*d,
        cross-attention 4*L_dec*S*d. The causal mask's halving is ignored (PaLM convention).
        """
        t = self.max_seq_len if seq_len is None else int(seq_len)
        cross_layers = self.decoder_layers if ARCHS[self.arch].cross else 0
        return 4 * (self.n_layers_total + cross_layers) * t * self.d_model

    def flops_per_token(self, training: bool = True, attention: bool = True,
                        seq_len: int | None = None) -> int:
        """FLOPs per token (PaLM appendix B / Chinchilla convention).

        forward  = 2 * N_matmul + (attention ? 4 * L * T * d : 0)
        training = 3 * forward  (backward = 2x forward)  ->  6 * N_matmul + 12 * L * T * d
        T defaults to max_seq_len. A multiply-add counts as 2 FLOPs. Encoder-decoder counts per
        target token with a source of equal length (one source token per target token), so
        N_matmul covers both stacks; see attention_flops_per_token for its attention terms.
        """
        fwd = 2 * self.n_params_matmul()
        if attention:
            fwd += self.attention_flops_per_token(seq_len)
        return 3 * fwd if training else fwd
