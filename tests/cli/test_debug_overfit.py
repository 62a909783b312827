"""`debug=overfit` trains on ONE pinned batch: the loss must go to ~0 (it stayed at ~2.3 when
the stream handed out a new batch every epoch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.slow
def test_debug_overfit_memorizes_one_batch(tmp_path: Path, train_cli) -> None:
    r = train_cli.run("debug=overfit", "model=gpt2_tiny", "data=pystdlib", "data.max_bytes=300000",
                      "tokenizer=byte", "model.max_seq_len=32", "model.d_model=64", "model.n_layers=2",
                      "model.n_heads=2", "train.global_batch_size=8", "train.num_threads=1",
                      "callbacks.sample.enabled=false", f"paths.output_dir={tmp_path / 'run'}",
                      *train_cli.isolated(tmp_path), timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["metrics"]["final/steps"] == 200
    assert summary["metrics"]["final/train_loss"] < 0.1, summary["metrics"]
