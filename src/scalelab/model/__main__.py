"""``python -m scalelab.model`` / ``scalelab-model``: print params and FLOPs of a model shape.

    scalelab-model --preset gpt2
    scalelab-model --d-model 12288 --n-layers 96 --n-heads 96 --vocab-size 50257 --max-seq-len 2048

Nothing is allocated: the numbers come from the ModelConfig alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import ModelConfig
from .presets import PRESETS, preset_dict, write_presets
from .summary import render_summary, summarize
from .variants import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS

_CHOICES = {"arch": ARCHS, "norm": NORMS, "norm_position": NORM_POSITIONS, "mlp": MLPS,
            "position": POSITIONS}


def _parse_value(text: str, type_name: str) -> Any:
    """A flag's value by the field's annotation, e.g. "int | None" (config.py's are strings)."""
    if text.lower() in ("null", "none") and "None" in type_name:
        return None
    base = type_name.split(" | ")[0]
    if base == "bool":
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return {"int": int, "float": float}.get(base, str)(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scalelab-model",
        description="Exact parameter count and FLOPs per token of a transformer shape, per "
                    "component. Start from --preset and override any ModelConfig field.")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="start from this preset (default: the ModelConfig defaults = gpt2)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length T for the attention FLOPs (default: max_seq_len)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--list-presets", action="store_true", help="list presets and their N")
    p.add_argument("--write-presets", type=Path, metavar="DIR",
                   help="write the Hydra presets of presets.py as YAML into DIR "
                        "(src/scalelab/conf/model) and exit")
    fields = p.add_argument_group("ModelConfig fields (see src/scalelab/model/config.py)")
    for f in dataclasses.fields(ModelConfig):
        type_name = str(f.type)
        fields.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, default=None,
            metavar=type_name.split(" | ")[0].upper(),
            type=lambda s, t=type_name: _parse_value(s, t),
            help=(f"one of {', '.join(_CHOICES[f.name])}; " if f.name in _CHOICES else "")
            + f"default {f.default!r}")
    return p


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    values = preset_dict(args.preset) if args.preset else {
        f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for f in dataclasses.fields(ModelConfig):
        if getattr(args, f.name) is not None:
            values[f.name] = getattr(args, f.name)
    if values["vocab_size"] is None:  # presets that take the vocab from the tokenizer
        values["vocab_size"] = 50257
        print("note: preset has vocab_size=null (set from the tokenizer when training); "
              "using 50257 (GPT-2 BPE) here, pass --vocab-size to change", file=sys.stderr)
    return ModelConfig.from_dict(values)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.write_presets:
        for path in write_presets(args.write_presets):
            print(path)
        return 0
    if args.list_presets:
        for name in sorted(PRESETS):
            d = preset_dict(name)
            vocab = f"vocab {d['vocab_size']}" if d["vocab_size"] else "vocab null: 50257 here"
            d["vocab_size"] = d["vocab_size"] or 50257
            n = ModelConfig.from_dict(d).n_params()
            print(f"{name:<18} {n:>16,}  ({vocab})")
        return 0
    try:
        cfg = config_from_args(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summarize(cfg, args.seq_len), indent=2))
    else:
        print(render_summary(cfg, args.seq_len), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
