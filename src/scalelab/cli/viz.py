"""`scalelab-viz`: attention maps for a prompt, and position-encoding pictures.

    scalelab-viz attention outputs/<run> --prompt "def main():" --out attn.png [--scale head]
    scalelab-viz positions [outputs/<run>] --out positions.png [--run-id ID]
The attention grid has one row per layer and one column per head, tokens on both axes, with a
colorbar; its title names the prompt, the run and the step. A run's position picture adds its
own geometry: its learned table's similarities, or (RoPE) its first layer's q.k by position.
With --run-id, or an MLflow run id as SOURCE, the PNG is logged to that run under viz/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch


def _run_label(source: str, meta: dict[str, Any], run_id: str | None) -> str:
    """"run <folder> (MLflow <id>), step N": which weights the picture shows."""
    path = Path(str(meta.get("_path") or source))
    name = path.parent.parent.name if path.parent.name == "checkpoints" else path.name
    mlflow_id = run_id or meta.get("mlflow_run_id")
    step = meta.get("_step")
    return (f"run {name}" + (f" (MLflow {str(mlflow_id)[:8]})" if mlflow_id else "")
            + (f", step {step}" if step is not None else ""))


def _attention(args: argparse.Namespace, model: Any, meta: dict[str, Any], run_id: str | None,
               out: Path) -> None:
    if model is None:
        raise ValueError("attention needs a SOURCE checkpoint")
    from scalelab.cli.checkpoints import tokenizer_from_spec
    from scalelab.viz.attention_maps import attention_weights, plot_attention_grid

    if not meta.get("tokenizer"):
        raise ValueError("no tokenizer recorded with this model; use its scalelab checkpoint")
    tok = tokenizer_from_spec(meta["tokenizer"])
    ids = tok.encode(args.prompt)[: model.cfg.max_seq_len]
    if not ids:
        raise ValueError("--prompt encodes to no tokens")
    w = attention_weights(model, torch.tensor([ids]))
    plot_attention_grid(w, [tok.decode([i]) for i in ids], out, scale=args.scale,
                        title=f"attention for {args.prompt[:60]!r}\n"
                              f"{_run_label(args.source, meta, run_id)}")


def _positions(args: argparse.Namespace, model: Any, meta: dict[str, Any], run_id: str | None,
               out: Path) -> None:
    """The analytic panels, plus (with a model) the run's own geometry."""
    from scalelab.viz.positions import plot_positions

    kw: dict[str, Any] = {}
    if model is not None:
        n_pos = min(64, model.cfg.max_seq_len)
        kw = {"d_model": model.cfg.d_model, "head_dim": model.cfg.head_dim,
              "rope_base": model.cfg.rope_base, "n_pos": n_pos,
              "title": f"positions: {_run_label(args.source, meta, run_id)}"}
        if model.cfg.position == "learned":
            kw["learned"] = model.pos.table.weight.detach()
        elif model.cfg.arch != "encoder_decoder":
            from scalelab.viz.attention_maps import first_layer_position_scores

            kw["run_scores"] = first_layer_position_scores(model, n_pos)
    plot_positions(out, **kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab-viz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("attention", "positions"))
    ap.add_argument("source", nargs="?", default=None,
                    help="a .ckpt, run folder, HF folder or MLflow run id (positions: optional)")
    ap.add_argument("--prompt", default="def main():\n    return 0\n")
    ap.add_argument("--scale", default="shared", choices=("shared", "head"),
                    help="attention colours: one scale for all heads, or one per head")
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--run-id", default=None, help="log the PNG to this MLflow run (viz/)")
    ap.add_argument("--tracking-uri", default=None)
    args = ap.parse_args(argv)
    from scalelab.cli.eval import load_model
    from scalelab.interop.families import NoEquivalentError

    out = Path(args.out).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        model, meta, run_id = (load_model(args.source, args.tracking_uri) if args.source
                               else (None, {}, None))
        if args.what == "attention":
            _attention(args, model, meta, run_id, out)
        else:
            _positions(args, model, meta, run_id, out)
    except (FileNotFoundError, ValueError, NoEquivalentError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    target = args.run_id or run_id
    if target:
        from scalelab.tracking.existing import log_to_run

        log_to_run(target, args.tracking_uri, files={"viz": out})
        print(f"logged {out.name} to MLflow run {target} under viz/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
