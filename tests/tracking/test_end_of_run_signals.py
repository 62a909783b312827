"""SIGTERM at each boundary of a run's end leaves MLflow, summary.json and the exit code
agreeing. Each child sends itself SIGTERM at one named phase ($SCALELAB_SIGNAL_AT_PHASE, see
scalelab.training.signals.at_phase), so every boundary is reached without depending on timing.

Before the outcome is decided (the upload, the start of the summary write) the run is KILLED
everywhere with exit 143; once it is decided (between summary.json and MLflow's end) the signal
is deferred and the run is FINISHED everywhere with exit 0."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from .signal_helpers import default_signals

pytestmark = pytest.mark.slow
# the final checkpoint upload, the summary write, MLflow's end (the other phases of
# training.signals.at_phase behave as "upload": the outcome is not decided yet)
EXPECTED = {"upload": ("KILLED", 143), "summary": ("KILLED", 143), "mlflow_end": ("FINISHED", 0)}


def test_sigterm_at_each_phase_of_the_end_is_recorded_the_same_everywhere(
        tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    uri = train_cli.store(tmp_path / "mlruns.db")
    procs: dict[str, subprocess.Popen] = {}
    try:
        for phase in EXPECTED:  # started together: the phases are independent runs
            procs[phase] = subprocess.Popen(
                train_cli.cmd(
                    "model=gpt2_tiny", "data=shakespeare", "tokenizer=char",
                    "train.global_batch_size=4", f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
                    "train.max_steps=2", "train.val_every=2", "train.val_batches=1",
                    "callbacks.sample.enabled=false", f"paths.output_dir={tmp_path / phase}",
                    *train_cli.isolated(tmp_path, tracking_uri=uri)),
                cwd=train_cli.repo, env=train_cli.env(SCALELAB_SIGNAL_AT_PHASE=phase),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                preexec_fn=default_signals)
        outs = {phase: p.communicate(timeout=600)[0] for phase, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(Exception):
                    p.communicate(timeout=30)
    client = MlflowClient(uri)
    for phase, (status, code) in EXPECTED.items():
        out = outs[phase]
        assert procs[phase].returncode == code, f"{phase}: {out[-3000:]}"
        assert "Traceback" not in out, f"{phase}: {out[-3000:]}"
        summary = json.loads((tmp_path / phase / "summary.json").read_text())
        run = client.get_run(summary["run_id"])
        assert (summary["status"], run.info.status) == (status, status), phase
        if status == "KILLED":
            assert run.data.tags.get("scalelab.stop_signal") == "SIGTERM", phase
        else:
            assert "came while the run's FINISHED status was being recorded" in out, phase
