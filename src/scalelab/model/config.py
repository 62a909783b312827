"""ModelConfig: the single source of truth for a transformer's shape.

Validation, the exact parameter count and the FLOPs per token all derive from this
dataclass alone (no torch import, no allocation), so a GPT-3-sized shape can be
accounted for on a laptop. The Hydra presets in ``conf/model/*.yaml`` mirror it field
for field; that is why the fields use ``Optional[X]`` and plain ``str`` (OmegaConf 2.3
rejects PEP 604 unions and ``Literal``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

# Names accepted by the string fields. The module registries (norms.NORMS, mlp.MLPS, ...)
# use exactly these keys; a test checks that they agree.
ARCHS = ("decoder", "encoder", "encoder_decoder")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
MLPS = ("gelu", "relu", "swiglu")
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
PARAMETRIZATIONS = ("standard", "mup")


@dataclass
class ModelConfig:
    """Shape and variant choices of one transformer. All fields have defaults (GPT-2 small)."""

    # --- architecture -------------------------------------------------------------------
    arch: str = "decoder"  # decoder (GPT) | encoder (BERT) | encoder_decoder (2017 Transformer)
    # Optional so a Hydra preset can say `null` and let the tokenizer fill it in; it must be a
    # positive int by the time the config is built.
    vocab_size: Optional[int] = 50257  # noqa: UP045
    max_seq_len: int = 1024  # n_ctx: size of learned position table, default eval length
    d_model: int = 768
    n_layers: int = 12  # blocks per stack; enc-dec uses it for both stacks unless overridden
    n_encoder_layers: Optional[int] = None  # noqa: UP045  # encoder_decoder only (None -> n_layers)
    n_decoder_layers: Optional[int] = None  # noqa: UP045  # encoder_decoder only (None -> n_layers)
    n_heads: int = 12
    n_kv_heads: Optional[int] = None  # noqa: UP045  # GQA: None -> n_heads (MHA); 1 -> MQA
    # --- feed-forward -------------------------------------------------------------------
    # None -> 4*d_model (gelu/relu). SwiGLU has three matrices instead of two, so the hidden
    # size shrinks to 8d/3 to keep ~8d^2 params (Shazeer 2020, Llama), then is rounded UP to
    # a multiple of ffn_multiple_of. 32 keeps tiny CPU models within a few % of 8d^2 while
    # giving GPU-friendly matmul shapes; Llama used 256 (set 256 to get d_ff=11008 at d=4096).
    d_ff: Optional[int] = None  # noqa: UP045
    ffn_multiple_of: int = 32
    mlp: str = "gelu"  # gelu | relu | swiglu
    # --- normalization ------------------------------------------------------------------
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_position: str = "pre"  # pre: x + F(LN(x)) (GPT-2) | post: LN(x + F(x)) (2017, BERT)
    norm_eps: float = 1e-5
    final_norm: Optional[bool] = None  # noqa: UP045  # None -> True for pre-LN, False for post-LN
    # --- positions ----------------------------------------------------------------------
    position: str = "learned"  # learned | sinusoidal | rope | alibi | none
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
    # scores use 1/head_dim; an lr tuned at the base width then stays optimal as width grows.
    parametrization: str = "standard"  # standard | mup
    mup_base_width: Optional[int] = None  # noqa: UP045  # mup: the d_model the lr was tuned at

    # ------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        # the values as given (before d_ff, n_kv_heads, final_norm are derived), for replace()
        self._given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        self._check_name("arch", ARCHS)
        self._check_name("norm", NORMS)
        self._check_name("norm_position", NORM_POSITIONS)
        self._check_name("mlp", MLPS)
        self._check_name("position", POSITIONS)
        self._check_name("parametrization", PARAMETRIZATIONS)
        self._check_mup()
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

        if self.arch != "encoder_decoder":
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
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.position='rope' needs an even head_dim, got head_dim={self.head_dim} "
                f"(d_model={self.d_model} / n_heads={self.n_heads}); RoPE rotates pairs of dims")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"ModelConfig.position='sinusoidal' needs an even d_model, got {self.d_model} "
                f"(sin/cos come in pairs)")
        if self.d_ff is None:
            self.d_ff = self.default_d_ff()
        if self.final_norm is None:
            self.final_norm = self.norm_position == "pre"

    def _check_name(self, name: str, allowed: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in allowed:
            raise ValueError(
                f"ModelConfig.{name}={value!r} is unknown; choose one of {', '.join(allowed)}")

    def _check_mup(self) -> None:
        if self.parametrization == "mup":
            if self.mup_base_width is None:
                raise ValueError(
                    "ModelConfig.parametrization='mup' needs mup_base_width: the d_model at which "
                    "the learning rate was tuned (e.g. model.mup_base_width=128)")
            self._check_positive_int("mup_base_width")
        elif self.mup_base_width is not None:
            raise ValueError(
                f"ModelConfig.mup_base_width={self.mup_base_width!r} is only used with "
                "parametrization=mup; set model.parametrization=mup or drop it")

    def _check_positive_int(self, name: str) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            hint = " (set it from the tokenizer)" if name == "vocab_size" and value is None else ""
            raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive integer{hint}")

    def default_d_ff(self) -> int:
        if self.mlp == "swiglu":
            hidden = int(8 * self.d_model / 3)
            return self.ffn_multiple_of * math.ceil(hidden / self.ffn_multiple_of)
        return 4 * self.d_model

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
        if self.arch == "decoder":
            return 0
        if self.arch == "encoder":
            return self.n_layers
        return self.n_encoder_layers if self.n_encoder_layers is not None else self.n_layers

    @property
    def decoder_layers(self) -> int:
        """Blocks in the decoder stack (0 for an encoder-only model)."""
        if self.arch == "encoder":
            return 0
        if self.arch == "decoder":
            return self.n_layers
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def width_multiplier(self) -> float:
        """µP's m = d_model / mup_base_width; 1.0 under the standard parametrization."""
        if self.parametrization != "mup" or self.mup_base_width is None:
            return 1.0
        return self.d_model / self.mup_base_width

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
        return _breakdown(self)

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

    def attention_flops_per_token(self, seq_len: Optional[int] = None) -> int:  # noqa: UP045
        """Forward FLOPs/token of the attention scores (QK^T and AV): 2 * 2 * T * d per layer.

        Encoder-decoder, per target token, assuming the source is as long as the target
        (S = T): encoder self-attention 4*L_enc*T*d, decoder self-attention 4*L_dec*T*d,
        cross-attention 4*L_dec*S*d. The causal mask's halving is ignored (PaLM convention).
        """
        t = self.max_seq_len if seq_len is None else int(seq_len)
        cross_layers = self.decoder_layers if self.arch == "encoder_decoder" else 0
        return 4 * (self.n_layers_total + cross_layers) * t * self.d_model

    def flops_per_token(self, training: bool = True, attention: bool = True,
                        seq_len: Optional[int] = None) -> int:  # noqa: UP045
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


@dataclass(frozen=True)
class Component:
    """One row of the accounting: ``count`` identical instances of ``params`` parameters."""

    name: str
    kind: str  # embedding | position | block | final_norm | head | attention_scores
    params: int  # per instance
    count: int = 1
    # forward FLOPs per token per instance; matmul rows 2*params, the output layer 2*V*d
    fwd_flops: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def total_params(self) -> int:
        return self.params * self.count

    @property
    def total_fwd_flops(self) -> int:
        return self.fwd_flops * self.count


def _norm_params(cfg: ModelConfig) -> int:
    # LayerNorm: gain (+ bias when bias=True); RMSNorm: gain only.
    return cfg.d_model * (2 if cfg.norm == "layernorm" and cfg.bias else 1)


def _attn_params(cfg: ModelConfig) -> int:
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    weights = d * d + 2 * d * kv + d * d  # q, k, v, out projections
    biases = (d + 2 * kv + d) if cfg.bias else 0
    return weights + biases


def _mlp_params(cfg: ModelConfig) -> int:
    d, f = cfg.d_model, cfg.d_ff
    assert f is not None
    n_in = 2 if cfg.mlp == "swiglu" else 1  # SwiGLU: gate and up projections
    weights = n_in * d * f + f * d
    biases = (n_in * f + d) if cfg.bias else 0
    return weights + biases


def _breakdown(cfg: ModelConfig) -> list[Component]:
    d, v = cfg.d_model, cfg.vocab_size
    assert v is not None
    rows = [Component("token embedding", "embedding", v * d)]
    if cfg.position == "learned":  # one table, shared by encoder and decoder
        rows.append(Component("position embedding (learned)", "embedding", cfg.max_seq_len * d))
    if cfg.embed_norm:
        rows.append(Component(f"embedding norm ({cfg.norm})", "final_norm", _norm_params(cfg), 1,
                              2 * _norm_params(cfg)))
    attn, mlp, norm = _attn_params(cfg), _mlp_params(cfg), _norm_params(cfg)
    t_attn = 4 * cfg.max_seq_len * d  # QK^T + AV forward FLOPs/token per attention layer
    stacks = [("encoder", cfg.encoder_layers, False), ("decoder", cfg.decoder_layers,
                                                      cfg.arch == "encoder_decoder")]
    for stack, n, cross in stacks:
        if n == 0:
            continue
        rows.append(Component(f"{stack} block: self-attention", "block", attn, n, 2 * attn))
        rows.append(Component(f"{stack} block: attention scores", "attention_scores", 0, n, t_attn))
        if cross:
            rows.append(Component(f"{stack} block: cross-attention", "block", attn, n, 2 * attn))
            rows.append(Component(f"{stack} block: cross-attention scores", "attention_scores",
                                  0, n, t_attn))
        rows.append(Component(f"{stack} block: mlp ({cfg.mlp})", "block", mlp, n, 2 * mlp))
        n_norms = 3 if cross else 2
        rows.append(Component(f"{stack} block: norms ({cfg.norm})", "block", n_norms * norm, n,
                              2 * n_norms * norm))
        if cfg.final_norm:
            rows.append(Component(f"{stack} final norm", "final_norm", norm, 1, 2 * norm))
    if cfg.mlm_head:  # BERT's transform: dense d->d (+ bias), GELU, norm
        transform = d * d + (d if cfg.bias else 0) + _norm_params(cfg)
        rows.append(Component("mlm head transform", "block", transform, 1, 2 * transform))
    head = (0 if cfg.tie_embeddings else v * d) + (v if cfg.mlm_head else 0)  # + output bias
    name = "output layer (tied to token embedding)" if cfg.tie_embeddings else "output layer"
    rows.append(Component(name, "head", head, 1, 2 * v * d))
    return rows
