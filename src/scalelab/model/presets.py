"""Named model shapes. conf/model/<name>.yaml mirrors each one field for field (a test checks).

``vocab_size: None`` means "take it from the tokenizer": the training CLI fills it in.
Only the gpt2 family and the accounting-only shapes (llama_7b, gpt3) pin a vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import ModelConfig

_GPT2: dict[str, Any] = dict(arch="decoder", norm="layernorm", norm_position="pre", mlp="gelu",
                             position="learned", bias=True, tie_embeddings=True)
_LLAMA: dict[str, Any] = dict(arch="decoder", norm="rmsnorm", norm_position="pre", mlp="swiglu",
                              position="rope", bias=False, tie_embeddings=False)
_BERT: dict[str, Any] = dict(arch="encoder", norm="layernorm", norm_position="post", mlp="gelu",
                             position="learned", bias=True, tie_embeddings=True, norm_eps=1e-12)
# Vaswani et al. 2017: post-LN, sinusoidal, ReLU, shared src/tgt/output embeddings scaled by sqrt(d)
_T2017: dict[str, Any] = dict(arch="encoder_decoder", norm="layernorm", norm_position="post",
                              mlp="relu", position="sinusoidal", bias=True, tie_embeddings=True,
                              scale_embeddings=True)

PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 small, exactly: 124,439,808 parameters
    "gpt2": {**_GPT2, "vocab_size": 50257, "max_seq_len": 1024, "d_model": 768, "n_layers": 12,
             "n_heads": 12},
    # CPU-sized GPT-2s: nanoGPT's "baby GPT" scale and a tiny one for tests
    "nano": {**_GPT2, "vocab_size": None, "max_seq_len": 64, "d_model": 128, "n_layers": 4,
             "n_heads": 4},
    "gpt2_tiny": {**_GPT2, "vocab_size": None, "max_seq_len": 64, "d_model": 64, "n_layers": 2,
                  "n_heads": 4},
    # Llama-style: RMSNorm, SwiGLU, RoPE, no bias, untied, GQA (4 query heads share 2 K/V heads)
    "llama_tiny": {**_LLAMA, "vocab_size": None, "max_seq_len": 128, "d_model": 128,
                   "n_layers": 4, "n_heads": 4, "n_kv_heads": 2},
    # Llama-1 7B shape, for accounting (6,738,415,616 params); too big for a CPU run
    "llama_7b": {**_LLAMA, "vocab_size": 32000, "max_seq_len": 2048, "d_model": 4096,
                 "n_layers": 32, "n_heads": 32, "d_ff": 11008, "norm_eps": 1e-6},
    # GPT-3 175B shape, for accounting only
    "gpt3": {**_GPT2, "vocab_size": 50257, "max_seq_len": 2048, "d_model": 12288, "n_layers": 96,
             "n_heads": 96},
    # BERT (encoder, post-LN, learned positions). No token-type embeddings, pooler or MLM
    # transform layer: the output layer is the tied embedding.
    "bert_tiny": {**_BERT, "vocab_size": None, "max_seq_len": 128, "d_model": 128, "n_layers": 2,
                  "n_heads": 2, "dropout": 0.1},
    "bert_base": {**_BERT, "vocab_size": None, "max_seq_len": 512, "d_model": 768,
                  "n_layers": 12, "n_heads": 12, "dropout": 0.1},
    # Transformer base (2017): d=512, 6+6 layers, 8 heads, d_ff=2048, dropout 0.1
    "transformer_base": {**_T2017, "vocab_size": None, "max_seq_len": 512, "d_model": 512,
                         "n_layers": 6, "n_heads": 8, "d_ff": 2048, "dropout": 0.1},
    "transformer_tiny": {**_T2017, "vocab_size": None, "max_seq_len": 64, "d_model": 64,
                         "n_layers": 2, "n_heads": 4, "d_ff": 256, "dropout": 0.0},
}


def preset_dict(name: str) -> dict[str, Any]:
    """Every ModelConfig field for preset ``name``, unresolved (d_ff None stays None), as in the yaml."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    out = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    out.update(PRESETS[name])
    return out


def preset(name: str, **overrides: Any) -> ModelConfig:
    """ModelConfig for a preset, e.g. ``preset("nano", vocab_size=65)``."""
    return ModelConfig.from_dict({**preset_dict(name), **overrides})
