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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="no chromium (apt-get install chromium)")
def test_ui_link_opens_runs_in_model_training_mode(tmp_path: Path) -> None:
    from conftest import free_port
    from scalelab.tracking.run import Tracker

    store = f"sqlite:///{tmp_path / 'm.db'}"
    tracker = Tracker.start(tracking_uri=store, experiment_name="browser_check",
                            run_name="visible_run", tags={},
                            artifact_root=str(tmp_path / "arts"))
    tracker.log_metrics({"val/loss": 2.5}, step=1)
    tracker.end("FINISHED")

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
            m = re.search(r"browser_check\s+(http://\S+)", line)
            link = m.group(1) if m else None
        assert link.endswith("?workflowType=machine_learning")
        while True:
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
            assert proc.poll() is None and time.time() < deadline, "UI did not come up"
            time.sleep(0.5)

        sys.path.insert(0, str(REPO / "scripts"))
        from ui_screenshot import screenshot

        text = screenshot(link, tmp_path / "ui.png", wait=120.0, until="visible_run")
        assert (tmp_path / "ui.png").stat().st_size > 10_000
        assert "visible_run" in text and "Run Name" in text, text[:2000]  # the runs table
        assert "Observability" not in text, text[:2000]  # the GenAI side navigation
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
