"""Load a local Hugging Face checkpoint (GPT-2, Llama, BERT) into our Transformer.

Reads ``config.json`` and ``model.safetensors`` (or a sharded ``model.safetensors.index.json``)
with the ``safetensors`` package only: pickled ``pytorch_model.bin`` files are refused, since
unpickling runs code. transformers is not needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scalelab.interop.families import NoEquivalentError, from_hf, normalize_hf_keys
from scalelab.interop.hf_config import model_config_from_hf
from scalelab.model import ModelConfig, Transformer

HF_PREFIX = "hf:"


def strip_prefix(source: str) -> Path:
    """``hf:PATH`` or ``PATH`` -> the folder."""
    s = str(source)
    return Path(s[len(HF_PREFIX):] if s.startswith(HF_PREFIX) else s).expanduser().resolve()


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such Hugging Face model folder")
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    return json.loads(path.read_text())


def _safetensor_files(folder: Path) -> list[Path]:
    """The folder's safetensors file(s); refuses pickle-only folders."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        return [folder / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    extra = f" (found {', '.join(pickles)}: pickles are never loaded; re-save the model with " \
            "save_pretrained(..., safe_serialization=True))" if pickles else ""
    raise FileNotFoundError(f"{folder}: no model.safetensors{extra}")


def _unreadable(path: Path, e: Exception) -> ValueError:
    return ValueError(f"{path}: not a valid safetensors file ({' '.join(str(e).split())}); "
                      "download or re-save the model")


def check_safetensors(folder: Path) -> None:
    """Every safetensors header of the folder parses and matches its file (the library checks
    the offsets against the size), without reading the tensors: a tampered file is refused
    before a run starts."""
    from safetensors import SafetensorError, safe_open

    for path in _safetensor_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            raise _unreadable(path, e) from None


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors file(s); refuses pickle-only folders."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in _safetensor_files(folder):
        try:
            out.update(load_file(str(path)))
        except SafetensorError as e:
            raise _unreadable(path, e) from None
    return out


def load_hf(source: str | Path) -> tuple[str, ModelConfig, dict[str, torch.Tensor]]:
    """(family, ModelConfig, our state_dict) from a local HF folder (``hf:`` prefix optional)."""
    folder = strip_prefix(str(source))
    hf_cfg = read_hf_config(folder)
    family, cfg = model_config_from_hf(hf_cfg)
    tensors = normalize_hf_keys(family, read_safetensors(folder))
    return family, cfg, from_hf(cfg, family, tensors)


def import_hf(source: str | Path) -> tuple[str, Transformer]:
    """(family, Transformer) with the HF weights loaded (strict: every key must match)."""
    family, cfg, sd = load_hf(source)
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise NoEquivalentError(f"{source}: weights do not fit the derived model "
                                f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return family, model.eval()


def load_into(model: Transformer, source: str | Path) -> str:
    """Copy HF weights into an existing model (``model.init_from=hf:PATH``); the shapes must
    agree exactly. Returns the family."""
    family, cfg, sd = load_hf(source)
    # settings that do not change the weights' meaning may differ
    free = ("dropout", "init_std", "scale_residual_init", "attention")
    ours = {k: v for k, v in model.cfg.to_dict().items() if k not in free}
    theirs = {k: v for k, v in cfg.to_dict().items() if k not in free}
    diff = sorted(k for k in ours if ours[k] != theirs[k])
    if diff:
        raise NoEquivalentError(
            f"model.init_from={source}: the configured model differs from the checkpoint in "
            + ", ".join(f"{k} ({ours[k]!r} vs {theirs[k]!r})" for k in diff))
    model.load_state_dict(sd, strict=True)
    return family
