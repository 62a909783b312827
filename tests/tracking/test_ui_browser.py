"""The link `make ui` prints opens the experiment in model-training mode, in a real browser.

MLflow 3.17 opens experiments in GenAI mode (traces, an assistant panel); the links carry
`?workflowType=machine_learning`. Headless Chromium renders the page (scripts/ui_screenshot.py);
skipped where no chromium binary is installed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalelab.training.callbacks import THROUGHPUT_KEYS

REPO = Path(__file__).resolve().parents[2]


CHROMIUM = pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                              reason="no chromium (apt-get install chromium)")


@contextlib.contextmanager
def _ui(tmp_path: Path, store: str, experiment: str) -> Iterator[str]:
    """`python -m scalelab.tracking.ui` over ``store``; yields the link it prints for ``experiment``."""
    from conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab.tracking.ui", "--port", str(port), "--store", store,
         "--artifacts", str(tmp_path / "arts")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        link = None
        deadline = time.time() + 180
        assert proc.stdout is not None
        while link is None:
            line = proc.stdout.readline()
            assert line and time.time() < deadline, "make ui printed no experiment link"
            m = re.search(rf"open (http://\S+)  \(runs of {experiment},", line)
            link = m.group(1) if m else None
        while True:
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
            assert proc.poll() is None and time.time() < deadline, "UI did not come up"
            time.sleep(0.5)
        yield link
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _screenshot() -> object:
    sys.path.insert(0, str(REPO / "scripts"))
    from ui_screenshot import screenshot

    return screenshot


@pytest.mark.slow
@CHROMIUM
def test_ui_link_opens_runs_in_model_training_mode(tmp_path: Path) -> None:
    from scalelab.tracking.run import Tracker

    store = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker.start(tracking_uri=store, experiment_name="browser_check",
                            run_name="visible_run", tags={},
                            artifact_root=str(tmp_path / "arts"))
    tracker.log_metrics({"val/loss": 2.5}, step=1)
    tracker.end("FINISHED")

    with _ui(tmp_path, store, "browser_check") as link:
        assert link.endswith("?workflowType=machine_learning")
        text = _screenshot()(link, tmp_path / "ui.png", wait=120.0, until="visible_run")
        assert (tmp_path / "ui.png").stat().st_size > 10_000
        assert "visible_run" in text and "Run Name" in text, text[:2000]  # the runs table
        assert "Observability" not in text, text[:2000]  # the GenAI side navigation


# the metric keys a scalelab-train run logs (training/modules.py, training/callbacks.py)
RUN_METRICS = ("train/loss", "train/ppl", "val/loss", "val/ppl", "val/bpb", "lr", "grad_norm",
               "tokens_seen", *THROUGHPUT_KEYS)


@pytest.mark.slow
@CHROMIUM
def test_run_metrics_page_orders_charts_by_key_prefix(tmp_path: Path) -> None:
    """Pins MLflow 3.17's rule that docs/training.md ("Chart order") explains: the run page's
    Model metrics tab has one section per key prefix (before the last `/`), sections sorted by
    name, then "Model metrics" for keys without a prefix; charts sorted by key. Nothing on the
    server (tag, config) changes it, so scalelab logs throughput without a prefix and the page
    opens on train/ and val/; a new MLflow that orders otherwise fails here."""
    from scalelab.tracking.run import Tracker

    store = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker.start(tracking_uri=store, experiment_name="chart_order",
                            run_name="curves", tags={}, artifact_root=str(tmp_path / "arts"))
    for step in (10, 20, 30):
        tracker.log_metrics({k: 1.0 + 1.0 / step for k in RUN_METRICS}, step=step)
    run_id = tracker.run_id
    tracker.end("FINISHED")

    with _ui(tmp_path, store, "chart_order") as link:
        page = link.replace("?", f"/runs/{run_id}/model-metrics?")
        out = Path(os.environ.get("SCALELAB_UI_SHOT", tmp_path / "metrics.png"))
        text = _screenshot()(page, out, width=1500, height=1400, wait=120.0, until="Model metrics")
    lines = [line.strip() for line in text.splitlines()]
    sections = [name for name in ("perf", "train", "val", "Model metrics") if name in lines]
    assert sections == ["train", "val", "Model metrics"], text[:3000]
    charts = [line for line in lines if line in {k.rsplit("/", 1)[-1] for k in RUN_METRICS}]
    # the page opens on the loss curves (train/, val/); lr and tokens/s follow in "Model
    # metrics" (rendered lazily below the fold, so only the section is checked)
    assert charts[:2] == ["loss", "ppl"] and "loss" in charts[2:5], charts
