"""A run's final values: computed from the trainer here, written by cli/outputs.py.

In MLflow they are tags ``final.<name>`` and a ``final_metrics.json`` table, not metrics: a
one-point metric becomes a one-point chart that pushes the loss curves down the run page, and
resuming a finished run would log it a second time. Tags are mutable, so a resumed run that
trains further simply updates them. Read them back with ``scalelab.tracking.final_values(run)``
(which also understands older runs' ``final/*`` metrics).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scalelab.cli.resume import module_start_step
from scalelab.config.spec import RunSpec
from scalelab.model import ModelConfig


def scalar_metrics(trainer: Any) -> dict[str, float]:
    """The trainer's last logged scalars (val/loss, train/loss, ...)."""
    return {k: float(v) for k, v in trainer.callback_metrics.items()
            if getattr(v, "numel", lambda: 1)() == 1}


def throughput_summary(callbacks: list[Any]) -> dict[str, float]:
    """Run averages measured by the ThroughputMonitor ({} when it did not run)."""
    from scalelab.training import ThroughputMonitor

    for cb in callbacks:
        if isinstance(cb, ThroughputMonitor):
            return dict(cb.summary)
    return {}


def final_metrics(trainer: Any, spec: RunSpec, model_cfg: ModelConfig, fit_seconds: float,
                  resumed_from: Path | None) -> dict[str, Any]:
    """``final/*`` values of a run whose fit (and last validation) is done."""
    step = int(trainer.global_step)
    cm = scalar_metrics(trainer)
    val_loss = cm.get("val/loss")
    perf = throughput_summary(trainer.callbacks)
    if perf.get("tokens_per_sec"):  # measured windows: no startup, no validation time
        tok_s, mfu = perf["tokens_per_sec"], perf.get("mfu")
    else:  # whole fit() wall time
        steps_this_session = step - module_start_step(resumed_from)
        tok_s = steps_this_session * spec.batch.tokens_per_step / max(fit_seconds, 1e-9)
        fpt = model_cfg.flops_per_token(training=True, attention=True, seq_len=spec.block_size)
        mfu = _mfu(spec, tok_s * fpt / spec.world_size)
    final = {
        "final/val_loss": val_loss,
        "final/val_bpb": cm.get("val/bpb"),
        "final/val_ppl": math.exp(val_loss) if val_loss is not None and val_loss < 50 else None,
        "final/train_loss": cm.get("train/loss"),
        "final/tokens_seen": tokens_seen(trainer, step * spec.batch.tokens_per_step),
        "final/steps": step,
        "final/tokens_per_s": tok_s,
        "final/mfu": mfu,
        "final/fit_seconds": fit_seconds,
        "final/time_to_first_step": perf.get("time_to_first_step"),
    }
    for k, v in cm.items():  # e.g. val/exact_match from the seq2seq module (not val/loss again)
        if k.startswith("val/") and f"final/{k[4:]}" not in final and f"final/val_{k[4:]}" not in final:
            final[f"final/{k[4:]}"] = v
    return final


def tokens_seen(trainer: Any, planned: int) -> int:
    """The module's own count (every device, carried over a resume), which is what tokens/s
    and FLOPs count: an encoder-decoder counts its padded target tokens, not steps x batch x
    block_size. ``planned`` for a module without one."""
    counted = int(getattr(trainer.lightning_module, "tokens_seen", 0) or 0)
    return counted or planned


def _mfu(spec: RunSpec, flops_per_s_per_device: float) -> float | None:
    from scalelab.training.perf import run_mfu

    return run_mfu(flops_per_s_per_device, str(spec.trainer.accelerator), str(spec.trainer.precision))


def record_final(tracker: Any, final: dict[str, Any]) -> None:
    """Tags ``final.<name>`` and the ``final_metrics.json`` table on the run."""
    values = {k.removeprefix("final/"): v for k, v in final.items() if v is not None}
    tracker.set_tags({f"final.{k}": v for k, v in values.items()})
    table = {"columns": ["name", "value"], "data": [[k, v] for k, v in values.items()]}
    tracker.log_text(json.dumps(table, indent=1) + "\n", "final_metrics.json")
