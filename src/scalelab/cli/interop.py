"""CLI glue for Hugging Face interop: ``scalelab-export --format hf`` and ``scalelab-import``.

    scalelab-export outputs/<run> --format hf --out exported/hf_model
    scalelab-import path/to/hf_folder [--out imported/<name>] [--tokenizer gpt2]
The conversions live in scalelab.interop; this file only reads and writes scalelab files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from scalelab.cli.checkpoints import (
    load,
    model_config_dict,
    run_meta,
    tokenizer_from_spec,
    verified_model,
)
from scalelab.model.variants import OBJECTIVE_OF_ARCH
from scalelab.training.checkpoint import RUN_KEY, write_checkpoint


def export_checkpoint_hf(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    """A scalelab checkpoint -> a Hugging Face folder; returns the export summary."""
    from scalelab.interop.hf_export import export_hf
    from scalelab.model import ModelConfig

    ckpt = load(checkpoint)
    cfg = ModelConfig.from_dict(model_config_dict(ckpt))
    meta = run_meta(ckpt)
    tok, spec = None, meta.get("tokenizer")
    if spec:
        try:
            tok = tokenizer_from_spec(spec)
        except (FileNotFoundError, ValueError) as e:
            print(f"note: tokenizer not exported ({e})", file=sys.stderr)
    info = {"source_checkpoint": ckpt["_path"], "global_step": ckpt.get("global_step"),
            "mlflow_run_id": meta.get("mlflow_run_id"), "objective": meta.get("objective")}
    weights = verified_model(ckpt).state_dict()  # tensors that do not fit the config: one line
    return export_hf(cfg, weights, out, tokenizer=tok, info=info)


def import_to_checkpoint(source: str | Path, out: str | Path,
                         tokenizer: str | None = None) -> dict[str, Any]:
    """A Hugging Face folder -> ``out/model.ckpt`` (read by scalelab-sample, -export, -eval)
    and ``out/config.json``; verifies logit parity against transformers when installed."""
    from scalelab.interop.hf_import import import_hf

    family, model = import_hf(source)
    cfg = model.cfg
    objective = OBJECTIVE_OF_ARCH[cfg.arch]
    diff = _parity_with_transformers(source, model)
    exported = _exported_meta(source)
    meta = {"model_config": cfg.to_dict(), "objective": objective, "data": exported.get("data"),
            "tokenizer": {"name": tokenizer} if tokenizer else exported.get("tokenizer"),
            "source": f"hf:{Path(str(source).removeprefix('hf:')).expanduser().resolve()}"}
    # no hyper_parameters (no Lightning module wrote it), so the model config rides in RUN_KEY
    ckpt = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "global_step": 0, RUN_KEY: meta}
    out = Path(out).expanduser().resolve()
    write_checkpoint(ckpt, out / "model.ckpt")  # atomic, with its size/hash sidecar
    info = {"family": family, "max_abs_logit_diff": diff, "n_params": cfg.n_params(),
            "checkpoint": str(out / "model.ckpt"), **meta}
    (out / "config.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _exported_meta(source: str | Path) -> dict[str, Any]:
    """A folder we exported names its source checkpoint, whose tokenizer and data we reuse."""
    from scalelab.interop.hf_import import strip_prefix

    info = strip_prefix(str(source)) / "scalelab.json"
    src = json.loads(info.read_text()).get("source_checkpoint") if info.is_file() else None
    if src and Path(src).is_file():
        return run_meta(load(src))
    return {}


def _parity_with_transformers(source: str | Path, model: Any) -> float | None:
    try:
        import transformers
    except ImportError:
        return None
    from scalelab.interop.families import HF_CLASS, family_of
    from scalelab.interop.hf_export import max_logit_diff, probe_ids
    from scalelab.interop.hf_import import strip_prefix

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cls = getattr(transformers, HF_CLASS[family_of(model.cfg)])
    theirs = cls.from_pretrained(str(strip_prefix(str(source))), dtype=torch.float32,
                                 use_safetensors=True)
    diff = max_logit_diff(model, theirs, probe_ids(model.cfg))
    if not diff <= 1e-4:
        raise ValueError(f"import parity failed: max |logit diff| = {diff:.3g} > 1e-4")
    return diff


def import_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab-import", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="a local Hugging Face folder (config.json + model.safetensors)")
    ap.add_argument("--out", default=None,
                    help="folder for model.ckpt + config.json (default: imported/<folder name>)")
    ap.add_argument("--tokenizer", default=None,
                    help="scalelab tokenizer name to record (e.g. gpt2) for sample/eval")
    args = ap.parse_args(argv)
    from scalelab.interop.families import NoEquivalentError

    try:
        out = args.out or Path("imported") / Path(args.source.removeprefix("hf:")).name
        info = import_to_checkpoint(args.source, out, args.tokenizer)
    except (FileNotFoundError, ValueError, NoEquivalentError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    diff = info["max_abs_logit_diff"]
    parity = "not checked (transformers not installed)" if diff is None else f"{diff:.3g}"
    print(f"imported {info['family']} ({info['n_params']:,} params) -> {info['checkpoint']}; "
          f"max |logit diff| vs transformers: {parity}")
    return 0


if __name__ == "__main__":
    sys.exit(import_main())
