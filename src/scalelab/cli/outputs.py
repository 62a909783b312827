"""What a finished run writes: final values and sample to MLflow and the run folder, the
summary dict (summary.json), and the closing lines on the console and in train.log."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from scalelab.cli.final import record_final
from scalelab.config.spec import RunSpec
from scalelab.data.files import atomic_write_text
from scalelab.tracking.redact import redact

log = logging.getLogger("scalelab.train")


def write_outputs(tracker: Any, spec: RunSpec, out_dir: Path, final: dict[str, Any],
                  sample: str, last_ckpt: Path, global_zero: bool) -> None:
    record_final(tracker, final)  # tags + a table artifact, not one-point metric charts
    if sample:
        atomic_write_text(out_dir / "sample.txt", sample)
        tracker.log_text(sample, "sample.txt")
    if spec.logger.log_checkpoint and last_ckpt.is_file() and global_zero:
        tracker.log_artifact(last_ckpt, "checkpoints")


def run_summary(tracker: Any, spec: RunSpec, out_dir: Path, final: dict[str, Any], sample: str,
                t_start: float, resumed_from: Path | None) -> dict[str, Any]:
    """What `scalelab-train` returns and writes to summary.json (plus its status)."""
    return {
        "run_id": tracker.run_id,
        "experiment_id": tracker.experiment_id,
        "tracking_uri": redact(tracker.tracking_uri) if tracker.tracking_uri else None,
        "experiment_name": str(spec.logger.experiment_name) if tracker.run_id else None,
        "run_name": spec.run_name,
        "output_dir": str(out_dir),
        "final_val_loss": final["final/val_loss"],
        "metrics": final,
        "sample": sample,
        "wall_seconds": time.time() - t_start,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "world_size": spec.world_size,
    }


def print_summary(s: dict[str, Any]) -> None:
    """The closing lines (console and train.log, through Hydra's job logging)."""
    m = s["metrics"]
    line = "─" * 72
    out = [line, "scalelab-train finished", line]
    if s["run_id"]:
        out.append(f"MLflow run    : {s['run_id']}  (experiment {s['experiment_name']!r})")
        out.append(f"tracking URI  : {s['tracking_uri']}")
    out.append(f"output folder : {s['output_dir']}")
    vl = s["final_val_loss"]
    if vl is not None:
        bpb = m.get("final/val_bpb")
        out.append(f"final val loss: {vl:.4f}" + (f"  ({bpb:.3f} bits/byte)" if bpb else ""))
    for k, v in m.items():
        if k.startswith("final/") and "exact" in k and v is not None:
            out.append(f"{k[6:]:<14}: {v:.4f}")
    mfu = m.get("final/mfu")
    out.append(
        f"trained       : {m['final/steps']} steps, {m['final/tokens_seen']:,} tokens in "
        f"{m['final/fit_seconds']:.0f} s ({m['final/tokens_per_s']:,.0f} tokens/s"
        + (f", MFU {100 * mfu:.1f}%" if mfu else "") + f"); wall {s['wall_seconds']:.0f} s"
    )
    if s["sample"]:
        out += ["sample:", s["sample"].rstrip(), line]
    if s["run_id"]:
        ui = "make ui" if str(s["tracking_uri"]).startswith("sqlite") else s["tracking_uri"]
        out.append(f"compare runs in the MLflow UI: {ui}  (python -m scalelab.tracking.ui)")
    log.info("\n".join(out))
