"""ModelConfig <-> a Hugging Face config.json (plain dicts; no transformers import).

Import fails with one line naming the HF field and value we cannot express exactly.
"""

from __future__ import annotations

from typing import Any

from scalelab.interop.families import EXACT_GELUS, TANH_GELUS, NoEquivalentError, family_of
from scalelab.model import ModelConfig

FAMILY_OF_MODEL_TYPE = {"gpt2": "gpt2", "llama": "llama", "bert": "bert"}


def _need(hf: dict[str, Any], key: str, allowed: tuple[Any, ...], why: str, default: Any = None) -> None:
    value = hf.get(key, default)
    if value not in allowed:
        raise NoEquivalentError(f"config.json {key}={value!r} cannot be expressed in scalelab: {why}")


def _rope_theta(hf: dict[str, Any]) -> float:
    rp = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = rp.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise NoEquivalentError(f"config.json rope type {kind!r} cannot be expressed in scalelab: "
                                "only plain RoPE (rope_type='default') is implemented")
    return float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _gelu_mlp(hf: dict[str, Any], key: str, default: str) -> str:
    """Our mlp for HF's GELU flavour: tanh -> gelu, exact erf -> gelu_exact."""
    _need(hf, key, TANH_GELUS + EXACT_GELUS, "scalelab has the tanh GELU (mlp=gelu) and the "
          "exact one (mlp=gelu_exact)", default)
    return "gelu_exact" if hf.get(key, default) in EXACT_GELUS else "gelu"


def _hf_gelu(cfg: ModelConfig) -> str:
    return "gelu" if cfg.mlp == "gelu_exact" else "gelu_pytorch_tanh"


def model_config_from_hf(hf: dict[str, Any]) -> tuple[str, ModelConfig]:
    """(family, ModelConfig) for a HF config.json dict of a GPT-2, Llama or BERT model."""
    model_type = hf.get("model_type")
    if model_type not in FAMILY_OF_MODEL_TYPE:
        raise NoEquivalentError(f"config.json model_type={model_type!r}: scalelab imports "
                                f"{', '.join(FAMILY_OF_MODEL_TYPE)} only")
    family = FAMILY_OF_MODEL_TYPE[model_type]
    if family == "gpt2":
        mlp = _gelu_mlp(hf, "activation_function", "gelu_new")
        _need(hf, "scale_attn_weights", (True,), "attention is always scaled by 1/sqrt(head_dim)",
              True)
        _need(hf, "scale_attn_by_inverse_layer_idx", (False,), "no per-layer attention scaling",
              False)
        _need(hf, "add_cross_attention", (False,), "a decoder-only model has no cross-attention",
              False)
        d = int(hf["n_embd"])
        fields = dict(arch="decoder", vocab_size=int(hf["vocab_size"]),
                      max_seq_len=int(hf["n_positions"]), d_model=d, n_layers=int(hf["n_layer"]),
                      n_heads=int(hf["n_head"]), d_ff=int(hf.get("n_inner") or 4 * d), mlp=mlp,
                      norm="layernorm", norm_position="pre",
                      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), position="learned",
                      bias=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    elif family == "llama":
        _need(hf, "hidden_act", ("silu",), "SwiGLU uses SiLU", "silu")
        _need(hf, "pretraining_tp", (1, None), "tensor-parallel slicing is not modelled", 1)
        d, h = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        if hf.get("head_dim") not in (None, d // h):
            raise NoEquivalentError(f"config.json head_dim={hf['head_dim']} cannot be expressed in "
                                    f"scalelab: head_dim is hidden_size/num_attention_heads={d // h}")
        bias = bool(hf.get("attention_bias", False))
        if bool(hf.get("mlp_bias", False)) != bias:
            raise NoEquivalentError(
                f"config.json attention_bias={bias} but mlp_bias={hf.get('mlp_bias')}: scalelab's "
                "model.bias switches both together")
        fields = dict(arch="decoder", vocab_size=int(hf["vocab_size"]),
                      max_seq_len=int(hf.get("max_position_embeddings", 2048)), d_model=d,
                      n_layers=int(hf["num_hidden_layers"]), n_heads=h,
                      n_kv_heads=int(hf.get("num_key_value_heads") or h),
                      d_ff=int(hf["intermediate_size"]), mlp="swiglu", norm="rmsnorm",
                      norm_position="pre", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                      position="rope", rope_base=_rope_theta(hf), bias=bias,
                      tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    else:
        mlp = _gelu_mlp(hf, "hidden_act", "gelu")
        _need(hf, "position_embedding_type", ("absolute",), "only absolute learned positions",
              "absolute")
        _need(hf, "is_decoder", (False,), "a BERT encoder only", False)
        fields = dict(arch="encoder", vocab_size=int(hf["vocab_size"]),
                      max_seq_len=int(hf["max_position_embeddings"]), d_model=int(hf["hidden_size"]),
                      n_layers=int(hf["num_hidden_layers"]), n_heads=int(hf["num_attention_heads"]),
                      d_ff=int(hf["intermediate_size"]), mlp=mlp, norm="layernorm",
                      norm_position="post", norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
                      position="learned", bias=True, final_norm=False, embed_norm=True,
                      mlm_head=True, tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    try:
        return family, ModelConfig(**fields, dropout=0.0)
    except ValueError as e:
        raise NoEquivalentError(f"config.json gives an invalid scalelab model: {e}") from e


def hf_config_kwargs(cfg: ModelConfig, pad_id: int | None = None, eos_id: int | None = None,
                     bos_id: int | None = None) -> tuple[str, dict[str, Any]]:
    """(family, kwargs for the transformers config class) for our ModelConfig."""
    family = family_of(cfg)
    tied = cfg.tie_embeddings
    if family == "gpt2":
        kw = dict(vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model,
                  n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
                  activation_function=_hf_gelu(cfg), layer_norm_epsilon=cfg.norm_eps,
                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
                  bos_token_id=bos_id if bos_id is not None else eos_id, eos_token_id=eos_id,
                  pad_token_id=pad_id)
    elif family == "llama":
        kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                  max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                  rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_base)},
                  attention_bias=cfg.bias, mlp_bias=cfg.bias, tie_word_embeddings=tied,
                  hidden_act="silu", bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    else:
        kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                  intermediate_size=cfg.d_ff, hidden_act=_hf_gelu(cfg),
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  max_position_embeddings=cfg.max_seq_len, type_vocab_size=1,
                  layer_norm_eps=cfg.norm_eps, tie_word_embeddings=tied,
                  pad_token_id=pad_id if pad_id is not None else 0)
    return family, kw


def compat_fields(cfg: ModelConfig) -> dict[str, Any]:
    """config.json entries that make transformers 4.x read the folder as 5.x does. 5.x writes
    RoPE's base only inside ``rope_parameters``, which 4.x ignores (it would run with its default
    theta of 10000), and names the weights' dtype ``dtype`` (4.x before 4.56: ``torch_dtype``)."""
    out: dict[str, Any] = {"torch_dtype": "float32"}
    if family_of(cfg) == "llama":
        out["rope_theta"] = float(cfg.rope_base)
    return out
