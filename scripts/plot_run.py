"""Plot a finished run's loss curves from its MLflow history (the README's loss-curve figure).

    python scripts/plot_run.py outputs/<date>/<time>_pystdlib_small --out docs/img/make_train_loss.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow.tracking import MlflowClient

from scalelab.tracking.sweep import metric_history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    summary = json.loads((args.run_dir / "summary.json").read_text())
    client = MlflowClient(summary["tracking_uri"])
    run_id = summary["run_id"]
    m = summary["metrics"]
    tokens_per_step = m["final/tokens_seen"] / max(m["final/steps"], 1)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        pts = metric_history(client, run_id, key)
        xs = [s * tokens_per_step / 1e6 for s, _ in pts]
        ax.plot(xs, [v for _, v in pts], style, label=key, markersize=4, linewidth=1.2)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(args.title or f"{summary['run_name']}: final val loss {summary['final_val_loss']:.3f}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
