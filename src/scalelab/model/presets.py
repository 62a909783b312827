"""Named model shapes: the one source of the Hydra presets in ``conf/model/``.

A family lists what it changes from the ModelConfig defaults (GPT-2 small); a preset names
its family and lists what it changes from that. ``python -m scalelab.model --write-presets
DIR`` writes them as YAML with the same structure (``DIR/family/<family>.yaml`` and
``DIR/<preset>.yaml`` with a Hydra defaults list); tests/model/test_presets.py checks that
the committed files are up to date and compose to the same configs.

No file lists every field: a field neither the family nor the preset names comes from the
dataclass default, which Hydra's train schema (a ModelConfig subclass) fills in. So a new
ModelConfig field is added in config.py alone.

``vocab_size: None`` means "take it from the tokenizer": the training CLI fills it in.
Only the gpt2 family and the accounting-only shapes (llama_7b, gpt3) pin a vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ModelConfig


@dataclass(frozen=True)
class Family:
    about: str  # one line, the family file's header
    fields: dict[str, Any]  # what differs from the ModelConfig defaults


@dataclass(frozen=True)
class Preset:
    family: str
    about: str  # one line, the preset file's header
    fields: dict[str, Any]  # what differs from the family


FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT-2: pre-LN, GELU, learned positions, biases, tied embeddings "
                   "(the ModelConfig defaults, so nothing differs)", {}),
    "llama": Family("Llama: RMSNorm, SwiGLU, RoPE, no biases, untied output layer",
                    dict(norm="rmsnorm", mlp="swiglu", position="rope", bias=False,
                         tie_embeddings=False)),
    "bert": Family("BERT: encoder, post-LN, learned positions, GELU; no token-type embeddings, "
                   "pooler or MLM transform (the output layer is the tied embedding)",
                   dict(arch="encoder", norm_position="post", norm_eps=1e-12, dropout=0.1)),
    "transformer": Family("Transformer (Vaswani et al. 2017): encoder-decoder, post-LN, "
                          "sinusoidal, ReLU, shared src/tgt/output embeddings scaled by sqrt(d)",
                          dict(arch="encoder_decoder", norm_position="post", mlp="relu",
                               position="sinusoidal", scale_embeddings=True, dropout=0.1)),
}

PRESETS: dict[str, Preset] = {
    "gpt2": Preset("gpt2", "GPT-2 small, exactly: 124,439,808 parameters", {}),
    "nano": Preset("gpt2", "nanoGPT-scale baby GPT for CPU runs (d=128, 4 layers, 4 heads, "
                   "block 64)", dict(vocab_size=None, max_seq_len=64, d_model=128, n_layers=4,
                                     n_heads=4)),
    "gpt2_tiny": Preset("gpt2", "Tiny GPT-2 for tests and smoke runs",
                        dict(vocab_size=None, max_seq_len=64, d_model=64, n_layers=2, n_heads=4)),
    "gpt3": Preset("gpt2", "GPT-3 175B shape, for accounting only",
                   dict(max_seq_len=2048, d_model=12288, n_layers=96, n_heads=96)),
    "llama_tiny": Preset("llama", "Tiny Llama-style decoder with GQA (4 query heads share 2 "
                         "K/V heads)", dict(vocab_size=None, max_seq_len=128, d_model=128,
                                            n_layers=4, n_heads=4, n_kv_heads=2)),
    "llama_7b": Preset("llama", "Llama-1 7B shape (6,738,415,616 params), for accounting "
                       "(python -m scalelab.model --preset llama_7b)",
                       dict(vocab_size=32000, max_seq_len=2048, d_model=4096, n_layers=32,
                            n_heads=32, d_ff=11008, norm_eps=1e-6)),
    "bert_tiny": Preset("bert", "Tiny BERT-style encoder (MLM)",
                        dict(vocab_size=None, max_seq_len=128, d_model=128, n_layers=2,
                             n_heads=2)),
    "bert_base": Preset("bert", "BERT-base shape encoder (d=768, 12 layers, 12 heads: as GPT-2 "
                        "small, the defaults)", dict(vocab_size=None, max_seq_len=512)),
    "transformer_base": Preset("transformer", "Transformer base (2017): d=512, 6+6 layers, "
                               "8 heads, d_ff=2048, dropout 0.1",
                               dict(vocab_size=None, max_seq_len=512, d_model=512, n_layers=6,
                                    n_heads=8, d_ff=2048)),
    "transformer_tiny": Preset("transformer", "Tiny 2017-style encoder-decoder for tests and "
                               "synthetic seq2seq tasks",
                               dict(vocab_size=None, max_seq_len=64, d_model=64, n_layers=2,
                                    n_heads=4, d_ff=256, dropout=0.0)),
}


def preset_dict(name: str) -> dict[str, Any]:
    """Every ModelConfig field for preset ``name``, unresolved (d_ff None stays None)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    out = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return out | FAMILIES[PRESETS[name].family].fields | PRESETS[name].fields


def preset(name: str, **overrides: Any) -> ModelConfig:
    """ModelConfig for a preset, e.g. ``preset("nano", vocab_size=65)``."""
    return ModelConfig.from_dict({**preset_dict(name), **overrides})


# --- the YAML files -------------------------------------------------------------------------
_GENERATED = "# Generated from src/scalelab/model/presets.py: edit there, then run\n" \
             "# `python -m scalelab.model --write-presets src/scalelab/conf/model`.\n"
_FIELD_ORDER = [f.name for f in dataclasses.fields(ModelConfig)]


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)  # YAML 1.1 reads 1e-06 as a string: it needs 1.0e-06
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0{e}{exponent}" if e and "." not in mantissa else text
    return str(value)


def _yaml_fields(fields: dict[str, Any]) -> list[str]:
    return [f"{k}: {_yaml_value(fields[k])}" for k in sorted(fields, key=_FIELD_ORDER.index)]


def family_yaml(name: str) -> str:
    lines = [f"# {FAMILIES[name].about}.", "# Only what differs from the ModelConfig defaults "
             "(src/scalelab/model/config.py), which fill in every other field.", *_yaml_fields(
                 FAMILIES[name].fields)]
    return _GENERATED + "\n".join(lines) + "\n"


def preset_yaml(name: str) -> str:
    p = PRESETS[name]
    lines = [f"# {p.about}."]
    if "vocab_size" in p.fields and p.fields["vocab_size"] is None:
        lines.append("# vocab_size: null -> the training CLI sets it from the tokenizer.")
    lines += ["defaults:", f"  - family/{p.family}@_here_", "  - _self_",
              *_yaml_fields(p.fields)]
    return _GENERATED + "\n".join(lines) + "\n"


def preset_files() -> dict[str, str]:
    """``{relative path: text}`` of every file in conf/model/."""
    files = {f"family/{name}.yaml": family_yaml(name) for name in FAMILIES}
    return files | {f"{name}.yaml": preset_yaml(name) for name in PRESETS}


def write_presets(directory: Path) -> list[Path]:
    """Write conf/model/ (family bases and presets) into ``directory``; returns the paths."""
    paths = []
    for rel, text in preset_files().items():
        path = Path(directory) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths
