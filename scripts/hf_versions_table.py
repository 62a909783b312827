"""Trained runs exported to Hugging Face, read back by several transformers installations.

    PYTHONPATH=src python scripts/hf_versions_table.py RUN_FOLDER... \
        --python .venv/bin/python --python /path/to/tf4venv/bin/python
Each run is exported with ``scalelab-export --format hf`` into a temporary folder. Each
``--python`` (an environment with torch + transformers; scalelab is never imported there) runs
scripts/hf_folder_check.py on it, with 4 windows of the run's own validation tokens. The table
gives, per run and transformers version, max |logit difference| against scalelab and the share
of positions where the argmax agrees.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parent / "hf_folder_check.py"


def _ours(run: str) -> tuple[object, torch.Tensor, str]:
    """(our model, 4 windows of the run's val tokens, tokenizer name)."""
    from scalelab.cli.checkpoints import load, model_config_dict, model_state_dict, run_meta
    from scalelab.data import PreparedData
    from scalelab.model import ModelConfig, Transformer

    ckpt = load(run)
    model = Transformer(ModelConfig.from_dict(model_config_dict(ckpt))).eval()
    model.load_state_dict(model_state_dict(ckpt))
    spec = run_meta(ckpt)["tokenizer"]
    tokens = PreparedData.load(spec["dir"]).tokens("val")
    block = min(64, model.cfg.max_seq_len)
    ids = torch.tensor(tokens[: 4 * block].astype("int64")).view(4, block)
    return model, ids, spec["name"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--python", action="append", required=True)
    args = ap.parse_args()
    from scalelab.cli.interop import export_checkpoint_hf

    tmp = Path(tempfile.mkdtemp(prefix="hf-versions-"))
    ours, req = {}, {}
    for i, run in enumerate(args.runs):
        model, ids, tok = _ours(run)
        res = export_checkpoint_hf(run, tmp / f"r{i}")
        with torch.no_grad():
            ours[f"r{i}"] = (Path(run).name, res["hf_class"], tok, model(ids))
        req[f"r{i}"] = {"folder": str(tmp / f"r{i}"), "ids": ids.tolist(), "texts": []}
    (tmp / "req.json").write_text(json.dumps(req))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print("| run | HF class | tokenizer | transformers | max abs logit diff | argmax agrees |")
    print("|---|---|---|---|---|---|")
    for python in args.python:
        out = tmp / "out.pt"
        subprocess.run([os.path.abspath(python), str(SCRIPT), str(tmp / "req.json"), str(out)], check=True,
                       env=env, cwd=tmp)
        got = torch.load(out, weights_only=False)
        for key, (name, cls, tok, logits) in ours.items():
            theirs = got[key]["logits"]
            diff = float((theirs - logits).abs().max())
            agree = float((theirs.argmax(-1) == logits.argmax(-1)).float().mean())
            print(f"| {name} | {cls} | {tok} | {got[key]['transformers']} | {diff:.2e} | "
                  f"{agree:.1%} |")
    print(f"# exports left in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    main()
