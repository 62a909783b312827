"""The links `make ui` prints open the right page, checked in a real browser.

MLflow 3.17 opens experiments in GenAI mode (traces, an assistant panel); the links carry
`?workflowType=machine_learning`, and a sweep's link opens its saved view (tracking/ui_view.py).
One real `mlflow server` (through `python -m scalelab.tracking.ui`) serves one store for the
module; headless Chromium renders each page (scripts/ui_screenshot.py). Skipped where no
chromium binary is installed (`make test-deps` installs it).
"""

from __future__ import annotations

import contextlib
import dataclasses
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


# the metric keys a scalelab-train run logs (training/modules.py, training/callbacks.py)
RUN_METRICS = ("train/loss", "train/ppl", "val/loss", "val/ppl", "val/bpb", "lr", "grad_norm",
               "tokens_seen", *THROUGHPUT_KEYS)
# a sweep's points as the sweep tags and logs them (scaling/point_config.py, tracking/params.py)
POINTS = (("1e+10", 3840, 3.22), ("1e+10", 7472, 3.15), ("3e+10", 7472, 3.05),
          ("3e+10", 14880, 2.98))


@dataclasses.dataclass
class Served:
    link: str  # the one link `make ui` printed: the newest experiment (the sweep)
    base: str
    ids: dict[str, str]  # experiment name -> id
    run_ids: dict[str, str]  # run name -> id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One store: a run with every training metric, and a sweep (a parent with four children,
    created last: the newest experiment), served by `make ui`."""
    from mlflow.entities import Metric, Param

    from conftest import sqlite_store
    from scalelab.tracking.run import Tracker
    from scalelab.tracking.sweep import SweepParent

    tmp = tmp_path_factory.mktemp("ui")
    store = sqlite_store(tmp / "m.db")
    arts = str(tmp / "arts")
    run_ids = {}
    tracker = Tracker.start(tracking_uri=store, experiment_name="chart_order", run_name="curves",
                            tags={}, artifact_root=arts)
    for step in (10, 20, 30):
        tracker.log_metrics({k: 1.0 + 1.0 / step for k in RUN_METRICS}, step=step)
    run_ids["curves"] = tracker.run_id
    tracker.end("FINISHED")
    parent = SweepParent.open(store, "sweep_ui_check", "ui_check", artifact_root=arts)
    now = int(time.time() * 1000)
    for budget, n, loss in POINTS:
        name = f"C{float(budget):.0e}-N{n}".replace("+", "")
        child = parent.client.create_run(parent.experiment_id, run_name=name, tags={
            "mlflow.parentRunId": parent.run_id, "sweep_budget": budget})
        parent.client.log_batch(child.info.run_id, metrics=[Metric("val/loss", loss, now, 30)],
                                params=[Param("n_params_matmul", str(n)),
                                        Param("compute", str(float(budget)))])
        parent.client.set_terminated(child.info.run_id)
    parent.end()
    client = parent.client
    ids = {e.name: e.experiment_id for e in client.search_experiments()}
    with _ui(tmp, store, "sweep_ui_check") as link:
        yield Served(link, link.split("/#/")[0], ids, run_ids)


@pytest.mark.slow
@CHROMIUM
def test_sweep_link_opens_its_points_with_the_headline_columns(served: Served,
                                                               tmp_path: Path) -> None:
    """The printed link opens the sweep's saved view: the classic runs table (model-training
    mode, not GenAI), one expanded group per budget with the children as rows, and the
    val loss / N / C columns."""
    assert "viewStateShareKey=scalelab_sweep" in served.link, served.link
    out = Path(os.environ.get("SCALELAB_UI_SHOT", tmp_path / "sweep.png"))
    text = _screenshot()(served.link, out, width=1200, height=720, wait=120.0,
                         until="C3e10-N14880", close_assistant=True)
    assert out.stat().st_size > 10_000
    assert "Run Name" in text and "Observability" not in text, text[:2000]  # not GenAI
    assert "shared view" in text, text[:2000]  # MLflow applied the saved view
    assert "Group: 1e+10" in text and "Group: 3e+10" in text, text[:2000]
    for _, n, _ in POINTS:  # every child is a visible row, not under a collapsed parent
        assert any(line.startswith("C") and line.endswith(f"-N{n}") for line in text.splitlines())
    for column in ("val/loss", "n_params_matmul", "compute"):
        assert column in text.splitlines(), text[:2000]


@pytest.mark.slow
@CHROMIUM
def test_run_metrics_page_orders_charts_by_key_prefix(served: Served, tmp_path: Path) -> None:
    """Pins MLflow 3.17's rule that docs/training.md ("Chart order") explains: the run page's
    Model metrics tab has one section per key prefix (before the last `/`), sections sorted by
    name, then "Model metrics" for keys without a prefix; charts sorted by key. Nothing on the
    server (tag, config) changes it, so scalelab logs throughput without a prefix and the page
    opens on train/ and val/; a new MLflow that orders otherwise fails here."""
    from scalelab.tracking.ui import experiment_url

    link = experiment_url(served.base, served.ids["chart_order"])
    run_id = served.run_ids["curves"]
    page = link.replace("?", f"/runs/{run_id}/model-metrics?")
    text = _screenshot()(page, tmp_path / "metrics.png", width=1500, height=1400, wait=120.0,
                         until="Model metrics")
    lines = [line.strip() for line in text.splitlines()]
    sections = [name for name in ("perf", "train", "val", "Model metrics") if name in lines]
    assert sections == ["train", "val", "Model metrics"], text[:3000]
    charts = [line for line in lines if line in {k.rsplit("/", 1)[-1] for k in RUN_METRICS}]
    # the page opens on the loss curves (train/, val/); lr and tokens/s follow in "Model
    # metrics" (rendered lazily below the fold, so only the section is checked)
    assert charts[:2] == ["loss", "ppl"] and "loss" in charts[2:5], charts
