"""Write our model as a Hugging Face folder (config.json + model.safetensors + tokenizer).

The folder is built in a temporary sibling and renamed into place only after the exported
model has been loaded back by transformers and its logits compared with ours, so a failed
export leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scalelab.data.files import atomic_folder
from scalelab.interop.families import HF_CLASS, family_of, to_hf
from scalelab.interop.hf_config import compat_fields, hf_config_kwargs
from scalelab.model import ModelConfig, Transformer

PARITY_TOL = 1e-4


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # the hf extra is optional
        raise ValueError("--format hf needs transformers and safetensors: "
                         "pip install 'scalelab[hf]'") from e
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def build_hf_model(cfg: ModelConfig, sd: dict[str, torch.Tensor],
                   special_ids: dict[str, int | None] | None = None) -> tuple[str, Any]:
    """(family, the transformers model holding our weights, fp32, eval mode)."""
    family = family_of(cfg)
    tf = _transformers()
    ids = special_ids or {}
    family, kw = hf_config_kwargs(cfg, ids.get("pad"), ids.get("eos"), ids.get("bos"))
    config_cls = {"gpt2": tf.GPT2Config, "llama": tf.LlamaConfig, "bert": tf.BertConfig}[family]
    model_cls = getattr(tf, HF_CLASS[family])
    config = config_cls(**kw)
    config.architectures = [HF_CLASS[family]]
    config.dtype = "float32"
    model = model_cls(config).float().eval()
    missing, unexpected = model.load_state_dict(to_hf(cfg, sd), strict=False)
    # HF ties the output weight to the embedding we did set, when tied
    allowed: set[str] = set()
    if cfg.tie_embeddings:
        allowed |= {"lm_head.weight", "cls.predictions.decoder.weight"}
    missing = [k for k in missing if k not in allowed]
    if missing or unexpected:
        raise ValueError(f"internal: {HF_CLASS[family]} keys did not match (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return family, model


def probe_ids(cfg: ModelConfig, seed: int = 0, batch: int = 2, length: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    assert cfg.vocab_size is not None
    return torch.randint(0, cfg.vocab_size, (batch, min(length, cfg.max_seq_len)), generator=g)


@torch.no_grad()
def max_logit_diff(ours: Transformer, theirs: Any, ids: torch.Tensor) -> float:
    """max |ours(ids) - theirs(ids)| in fp32 (no padding: every position is compared)."""
    a = ours.float().eval()(ids)
    b = theirs.float().eval()(input_ids=ids).logits
    return float((a - b).abs().max())


def export_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor], out: str | Path,
              tokenizer: Any = None, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the HF folder ``out`` (must not exist or be empty); returns what was written,
    including the measured parity ``max_abs_logit_diff``."""
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out}: exists and is not an empty folder; choose a new folder")
    family_of(cfg)  # the clear error comes before any work
    ours = Transformer(cfg)
    ours.load_state_dict(sd)
    special = {}
    if tokenizer is not None and hasattr(tokenizer, "pad_id"):
        special = {"pad": tokenizer.pad_id, "eos": tokenizer.eot_id, "bos": tokenizer.bos_id}
    family, hf_model = build_hf_model(cfg, ours.state_dict(), special)
    # written beside ``out`` and renamed into place whole (scalelab.data.files.atomic_folder)
    with atomic_folder(out) as tmp:
        hf_model.save_pretrained(str(tmp), safe_serialization=True)
        written = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**written, **compat_fields(cfg)}, indent=2)
                                         + "\n")
        tok_note = "none (no tokenizer recorded)"
        if tokenizer is not None and hasattr(tokenizer, "enc"):
            from scalelab.interop.hf_tokenizer import save_hf_tokenizer

            save_hf_tokenizer(tokenizer, tmp, cfg.max_seq_len)
            tok_note = f"{tokenizer.name} -> tokenizer.json"
        elif tokenizer is not None:
            tok_note = f"{type(tokenizer).__name__} has no Hugging Face equivalent; not written"
        # parity on what was WRITTEN: load the folder back the way a user would
        tf = _transformers()
        loaded = getattr(tf, HF_CLASS[family]).from_pretrained(str(tmp), dtype=torch.float32)
        diff = max_logit_diff(ours, loaded, probe_ids(cfg))
        if not diff <= PARITY_TOL:
            raise ValueError(f"export parity failed: max |logit diff| = {diff:.3g} > {PARITY_TOL}")
        result = {"format": "hf", "family": family, "hf_class": HF_CLASS[family],
                  "max_abs_logit_diff": diff, "tokenizer": tok_note, **(info or {}),
                  "model_config": cfg.to_dict()}
        (tmp / "scalelab.json").write_text(json.dumps(result, indent=2) + "\n")
    return {**result, "out": str(out)}
