"""`scalelab-export`: a checkpoint -> plain ``model.pt`` (state_dict) + ``config.json``.

    scalelab-export outputs/<run>/checkpoints/last.ckpt --out exported/shakespeare
    # then, anywhere with torch + scalelab.model (no Lightning needed):
    cfg = ModelConfig.from_dict(json.load(open("exported/shakespeare/config.json"))["model_config"])
    model = Transformer(cfg); model.load_state_dict(torch.load("exported/shakespeare/model.pt",
                                                               weights_only=True))
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from scalelab.cli.checkpoints import load, model_config_dict, run_meta, verified_model
from scalelab.data.files import atomic_folder

EXPORTED = frozenset({"model.pt", "config.json"})  # an earlier export in --out is replaced whole


def export(checkpoint: str | Path, out: str | Path) -> Path:
    """Write ``out/model.pt`` and ``out/config.json``; returns ``out``. Verifies the round trip."""
    from scalelab.model import ModelConfig

    ckpt = load(checkpoint)
    cfg = ModelConfig.from_dict(model_config_dict(ckpt))
    model = verified_model(ckpt)  # one line, not later, if the tensors do not fit the config
    # through the model: the saved tensors are exactly the model's, contiguous and detached
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    meta = run_meta(ckpt)
    info = {
        "model_config": cfg.to_dict(),
        "objective": meta.get("objective"),
        "tokenizer": meta.get("tokenizer"),
        "n_params": cfg.n_params(),
        "global_step": ckpt.get("global_step"),
        "mlflow_run_id": meta.get("mlflow_run_id"),
        "source_checkpoint": ckpt["_path"],
    }
    out = Path(out).expanduser().resolve()
    # the pair appears together or not at all: never a model.pt beside another export's config
    with atomic_folder(out, may_replace=EXPORTED.__contains__) as tmp:
        with open(tmp / "model.pt", "wb") as f:
            torch.save(sd, f)
        (tmp / "config.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


# What the written folder was checked against (tests/interop/test_hf_portability.py); an
# older transformers may load it differently, so the user is told where the proof stops.
LOADS_WITH = ("the folder loads with transformers 4.57.6 and 5.25.0 (tested, same logits); "
              "transformers older than 4.57 is untested (docs/interop.md)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab-export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a .ckpt file or a run folder (uses checkpoints/last.ckpt)")
    ap.add_argument("--out", required=True, help="folder for model.pt + config.json")
    ap.add_argument("--format", choices=("pt", "hf"), default="pt",
                    help="pt: model.pt + config.json; hf: a Hugging Face folder (from_pretrained)")
    args = ap.parse_args(argv)
    if args.format == "hf":
        from scalelab.cli.interop import export_checkpoint_hf

        try:
            res = export_checkpoint_hf(args.checkpoint, args.out)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"exported {res['hf_class']} to {res['out']} (max |logit diff| "
              f"{res['max_abs_logit_diff']:.3g}; tokenizer: {res['tokenizer']})")
        print(f"note: {LOADS_WITH}")
        return 0
    try:
        out = export(args.checkpoint, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {out / 'model.pt'} and {out / 'config.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
