"""Which Hugging Face class a ModelConfig maps onto, and the weight maps both ways.

Three families, matched by the options that change the computation:
  gpt2   pre-LN LayerNorm decoder, GELU (tanh or exact), learned positions, biases -> GPT2LMHeadModel
  llama  pre-RMSNorm decoder, SwiGLU, RoPE (half-split, as HF's rotate_half) -> LlamaForCausalLM
  bert   post-LN LayerNorm encoder, GELU (tanh or exact), learned positions, biases, an embedding
         LayerNorm and BERT's MLM transform (model.embed_norm, model.mlm_head) -> BertForMaskedLM
Weights are mapped by state_dict keys. Our self-attention keeps q, k and v in one Linear,
``qkv_proj`` (rows q, then k, then v); GPT-2's ``c_attn`` is the same matrix transposed (its
Conv1D stores [in, out]), while Llama and BERT keep three matrices, so the rows are split on
export and joined on import. This module imports only torch: the import path reads safetensors
without transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from scalelab.model import ModelConfig

# GELU flavours as HF spells them: the tanh approximation (our mlp: gelu) and the exact erf form
# (our mlp: gelu_exact)
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
EXACT_GELUS = ("gelu",)
GELU_MLPS = ("gelu", "gelu_exact")
HF_CLASS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertForMaskedLM"}


class NoEquivalentError(ValueError):
    """A config (ours or Hugging Face's) that the other side cannot express exactly."""


# --- scalelab -> family ----------------------------------------------------------------------
_COMMON = {"scale_embeddings": False, "parametrization": "standard"}
_REQUIRED: dict[str, dict[str, Any]] = {
    "gpt2": {**_COMMON, "arch": "decoder", "norm_position": "pre", "norm": "layernorm",
             "mlp": GELU_MLPS, "position": "learned", "bias": True, "final_norm": True,
             "embed_norm": False, "mlm_head": False},
    "llama": {**_COMMON, "arch": "decoder", "norm_position": "pre", "norm": "rmsnorm",
              "mlp": "swiglu", "position": "rope", "final_norm": True, "embed_norm": False,
              "mlm_head": False},
    "bert": {**_COMMON, "arch": "encoder", "norm_position": "post", "norm": "layernorm",
             "mlp": GELU_MLPS, "position": "learned", "bias": True, "final_norm": False,
             "embed_norm": True, "mlm_head": True},
}


def _options(required: Any) -> tuple[Any, ...]:
    """A required value, or a tuple of accepted ones."""
    return required if isinstance(required, tuple) else (required,)


def _blockers(cfg: ModelConfig, family: str) -> list[str]:
    out = [f"model.{k}={getattr(cfg, k)!r} (needs {' or '.join(map(repr, _options(v)))})"
           for k, v in _REQUIRED[family].items() if getattr(cfg, k) not in _options(v)]
    if family == "gpt2" and cfg.kv_heads != cfg.n_heads:
        out.append(f"model.n_kv_heads={cfg.kv_heads} (GPT-2 has no GQA: needs n_heads)")
    return out


def family_of(cfg: ModelConfig) -> str:
    """The Hugging Face family this config is exactly equivalent to, or NoEquivalentError
    naming, per family, the options standing in the way."""
    blockers = {f: _blockers(cfg, f) for f in _REQUIRED}
    for family, why in blockers.items():
        if not why:
            return family
    closest = sorted(blockers, key=lambda f: len(blockers[f]))
    lines = "; ".join(f"{HF_CLASS[f]}: {', '.join(blockers[f])}" for f in closest)
    hint = ""
    extras = ("model.embed_norm", "model.mlm_head")
    if cfg.arch == "encoder" and all(b.startswith(extras) for b in blockers["bert"]):
        hint = (" (BertForMaskedLM always has an embedding LayerNorm and an MLM transform; train"
                " with model.embed_norm=true model.mlm_head=true to export BERT)")
    raise NoEquivalentError(f"no Hugging Face equivalent for this model; {lines}{hint}")


# --- weight maps: a list of (our key, HF key, to_hf, from_hf) per family -----------------------
Fn = Callable[[torch.Tensor], torch.Tensor]
_same: Fn = lambda t: t  # noqa: E731
_t: Fn = lambda t: t.t().contiguous()  # noqa: E731  # GPT-2's Conv1D stores [in, out]


def _pairs(cfg: ModelConfig, family: str) -> list[tuple[str, str, Fn, Fn]]:
    rows: list[tuple[str, str, Fn, Fn]] = []

    def add(ours: str, theirs: str, to: Fn = _same, back: Fn = _same) -> None:
        rows.append((ours, theirs, to, back))

    n = cfg.n_layers
    if family == "gpt2":
        add("tok_emb.weight", "transformer.wte.weight")
        add("pos.table.weight", "transformer.wpe.weight")
        for i in range(n):
            o, h = f"decoder.blocks.{i}", f"transformer.h.{i}"
            for p in ("weight", "bias"):
                add(f"{o}.self_attn.norm.{p}", f"{h}.ln_1.{p}")
                add(f"{o}.mlp.norm.{p}", f"{h}.ln_2.{p}")
            add(f"{o}.self_attn.fn.qkv_proj.weight", f"{h}.attn.c_attn.weight", _t, _t)
            add(f"{o}.self_attn.fn.qkv_proj.bias", f"{h}.attn.c_attn.bias")
            add(f"{o}.self_attn.fn.o_proj.weight", f"{h}.attn.c_proj.weight", _t, _t)
            add(f"{o}.self_attn.fn.o_proj.bias", f"{h}.attn.c_proj.bias")
            add(f"{o}.mlp.fn.up.weight", f"{h}.mlp.c_fc.weight", _t, _t)
            add(f"{o}.mlp.fn.up.bias", f"{h}.mlp.c_fc.bias")
            add(f"{o}.mlp.fn.down.weight", f"{h}.mlp.c_proj.weight", _t, _t)
            add(f"{o}.mlp.fn.down.bias", f"{h}.mlp.c_proj.bias")
        for p in ("weight", "bias"):
            add(f"decoder.final_norm.{p}", f"transformer.ln_f.{p}")
    elif family == "llama":
        add("tok_emb.weight", "model.embed_tokens.weight")
        for i in range(n):
            o, h = f"decoder.blocks.{i}", f"model.layers.{i}"
            add(f"{o}.self_attn.norm.weight", f"{h}.input_layernorm.weight")
            add(f"{o}.mlp.norm.weight", f"{h}.post_attention_layernorm.weight")
            ps = ("weight", "bias") if cfg.bias else ("weight",)
            for p in ps:
                add(f"{o}.self_attn.fn.o_proj.{p}", f"{h}.self_attn.o_proj.{p}")
                for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                    add(f"{o}.mlp.fn.{ours}.{p}", f"{h}.mlp.{theirs}.{p}")
        add("decoder.final_norm.weight", "model.norm.weight")
    else:  # bert
        e = "bert.embeddings"
        add("tok_emb.weight", f"{e}.word_embeddings.weight")
        add("pos.table.weight", f"{e}.position_embeddings.weight")
        for i in range(n):
            o, h = f"encoder.blocks.{i}", f"bert.encoder.layer.{i}"
            for p in ("weight", "bias"):
                add(f"{o}.self_attn.fn.o_proj.{p}", f"{h}.attention.output.dense.{p}")
                add(f"{o}.self_attn.norm.{p}", f"{h}.attention.output.LayerNorm.{p}")
                add(f"{o}.mlp.fn.up.{p}", f"{h}.intermediate.dense.{p}")
                add(f"{o}.mlp.fn.down.{p}", f"{h}.output.dense.{p}")
                add(f"{o}.mlp.norm.{p}", f"{h}.output.LayerNorm.{p}")
        for p in ("weight", "bias"):
            add(f"embed_norm.{p}", f"{e}.LayerNorm.{p}")
            add(f"mlm_transform.dense.{p}", f"cls.predictions.transform.dense.{p}")
            add(f"mlm_transform.norm.{p}", f"cls.predictions.transform.LayerNorm.{p}")
    if not cfg.tie_embeddings:
        add("lm_head.weight", "cls.predictions.decoder.weight" if family == "bert" else "lm_head.weight")
    return rows


def _split_qkv(cfg: ModelConfig, family: str) -> list[tuple[str, tuple[str, str, str]]]:
    """(our fused qkv_proj tensor, the HF tensors holding its q, k and v rows) for the families
    that keep q, k and v apart (Llama, BERT); GPT-2's c_attn is a plain row of _pairs."""
    if family == "gpt2":
        return []
    rows: list[tuple[str, tuple[str, str, str]]] = []
    suffixes = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layers):
        if family == "llama":
            ours, h = f"decoder.blocks.{i}.self_attn.fn.qkv_proj", f"model.layers.{i}.self_attn"
            names = (f"{h}.q_proj", f"{h}.k_proj", f"{h}.v_proj")
        else:
            ours, h = f"encoder.blocks.{i}.self_attn.fn.qkv_proj", f"bert.encoder.layer.{i}.attention.self"
            names = (f"{h}.query", f"{h}.key", f"{h}.value")
        for p in suffixes:
            q, k, v = (f"{n}.{p}" for n in names)
            rows.append((f"{ours}.{p}", (q, k, v)))
    return rows


def _qkv_rows(cfg: ModelConfig) -> list[int]:
    kv = cfg.kv_heads * cfg.head_dim
    return [cfg.d_model, kv, kv]


def to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state_dict -> the HF model's state_dict (tied output weights left to HF)."""
    family = family_of(cfg)
    out = {theirs: to(sd[ours]) for ours, theirs, to, _ in _pairs(cfg, family)}
    for ours, theirs in _split_qkv(cfg, family):
        out.update(zip(theirs, sd[ours].split(_qkv_rows(cfg)), strict=True))
    if family == "bert":
        d = cfg.d_model
        out["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(1, d)
        # the decoder's own bias is the one forward() adds; untied, it is not cls.predictions.bias
        out["cls.predictions.bias"] = out["cls.predictions.decoder.bias"] = sd["lm_head.bias"]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def from_hf(cfg: ModelConfig, family: str, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF model's tensors -> our state_dict for Transformer(cfg)."""
    missing = [t for _, t, _, _ in _pairs(cfg, family) if t not in hf]
    missing += [t for _, theirs in _split_qkv(cfg, family) for t in theirs if t not in hf]
    if missing:
        raise NoEquivalentError(
            f"the Hugging Face weights lack {len(missing)} tensor(s) a {HF_CLASS[family]} needs, "
            f"e.g. {missing[:3]}")
    sd = {ours: back(hf[theirs]) for ours, theirs, _, back in _pairs(cfg, family)}
    for ours, theirs in _split_qkv(cfg, family):
        sd[ours] = torch.cat([hf[t] for t in theirs])
    if family == "bert":
        bias = hf.get("cls.predictions.decoder.bias", hf.get("cls.predictions.bias"))
        if bias is None:
            raise NoEquivalentError("the Hugging Face weights have no MLM head bias "
                                    "(cls.predictions.bias): not a BertForMaskedLM checkpoint")
        sd["lm_head.bias"] = bias
        # token_type_ids default to 0, so row 0 is added at every position: fold it into the
        # position table (exact for inputs without segment ids, which is all we feed).
        tt = hf.get("bert.embeddings.token_type_embeddings.weight")
        if tt is not None:
            sd["pos.table.weight"] = sd["pos.table.weight"] + tt[0]
    if cfg.tie_embeddings:
        sd["lm_head.weight"] = sd["tok_emb.weight"]
    return {k: v.to(torch.float32) for k, v in sd.items()}


def normalize_hf_keys(family: str, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys of a bare base model (GPT2Model, LlamaModel) -> the LM-head class's keys."""
    prefix = {"gpt2": "transformer.", "llama": "model.", "bert": "bert."}[family]
    out = {}
    for k, v in hf.items():
        bare = not k.startswith((prefix, "lm_head.", "cls."))
        out[prefix + k if bare else k] = v
    return out


