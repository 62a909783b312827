"""Load checks of a tracking server (docs/cluster.md), against $MLFLOW_TRACKING_URI or --uri.

    python scripts/cluster_bench.py writers --writers 16 --rows 500
        16 processes, each one scalelab Tracker run logging ROWS steps of 2 metrics at once;
        then counts the stored rows and the run statuses.
    python scripts/cluster_bench.py store --from-sweep slurm1 --children 500 [--to URI]
        a sweep parent `big<children>` whose children copy the given sweep's finished children
        (unique point ids; final metrics, and the val/loss and tokens_seen histories the
        curves come from), written to --to (default: the same server); then times
        collect_runs, the read behind `scalelab-fit --sweep big<children>`.
    python scripts/cluster_bench.py read --sweep big500 [--readers 1]
        times that read again, on a sweep already written (--readers 1: history requests one
        at a time instead of concurrently).
    python scripts/cluster_bench.py ui --sweep big500 [--uri http://127.0.0.1:PORT]
        times the MLflow UI's run list of the sweep's experiment in headless Chromium: from
        navigating to the page until the table shows the parent run, and from expanding it
        until its children show; loaded twice in one browser (the first load fetches the
        UI's scripts too).
    python scripts/cluster_bench.py outage --steps 300 --down-s 25
        one training run (a step's metrics sent at once) whose server cluster-up started is
        stopped after 20 steps and started again; then counts the run's rows (run as root,
        in the repo, with SCALELAB_CLUSTER_DIR if cluster-up used another folder).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = """
import sys
from pathlib import Path
from scalelab.tracking.run import Tracker
uri, exp, i, rows, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t = Tracker.start(uri, exp, f"writer{i}", {"writer": str(i)}, folder=Path(folder))
for step in range(rows):
    t.log_metrics({"a": step * 0.5, "b": float(i)}, step=step)
assert t.end("FINISHED")
"""


def writers(uri: str, n: int, rows: int) -> None:
    from mlflow.tracking import MlflowClient

    exp = f"writers_{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        procs = []
        for i in range(n):
            (Path(tmp) / str(i)).mkdir()
            procs.append(subprocess.Popen([sys.executable, "-c", WRITER, uri, exp, str(i), str(rows),
                                           str(Path(tmp) / str(i))], stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
        wall = time.time() - t0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    counts = [len(client.get_metric_history(r.info.run_id, k)) for r in runs for k in ("a", "b")]
    print(f"{n} writers x {rows} steps x 2 metrics: exit codes {sorted(set(codes))}, {len(runs)} runs "
          f"{sorted({r.info.status for r in runs})}, {sum(counts)} of {n * rows * 2} metric rows "
          f"stored (per series {min(counts)}..{max(counts)}), {wall:.1f} s")


def store(uri: str, dest: str, sweep: str, children: int) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from scalelab.tracking.sweep import find_sweep_parent

    src = find_sweep_parent(uri, sweep)
    if src is None:
        sys.exit(f"no sweep {sweep!r} in {uri}")
    kids = [c for c in src.children() if c.status == "FINISHED"]
    d, s = MlflowClient(dest), MlflowClient(uri)
    # the curves collect reads: each copy gets the source child's whole history of these
    curve_keys = ("val/loss", "tokens_seen")
    history = {k.run_id: [m for key in curve_keys for m in s.get_metric_history(k.run_id, key)]
               for k in kids}
    name = f"big{children}"
    exp = d.get_experiment_by_name(f"sweep_{name}")
    exp_id = exp.experiment_id if exp else d.create_experiment(f"sweep_{name}")
    parent = d.create_run(exp_id, run_name=f"sweep_{name}",
                          tags={"scalelab.sweep_role": "parent", "scalelab.sweep_name": name})
    t0 = time.time()
    for i in range(children):
        k = s.get_run(kids[i % len(kids)].run_id)
        tags = {t: v for t, v in k.data.tags.items() if not t.startswith("mlflow.")}
        tags |= {"sweep_point_id": f"{tags.get('sweep_point_id')}_{i}", "sweep_name": name,
                 "mlflow.parentRunId": parent.info.run_id}
        r = d.create_run(exp_id, run_name=f"c{i}", tags=tags)
        now = int(time.time() * 1000)
        latest = [Metric(m, v, now, 0) for m, v in k.data.metrics.items() if m not in curve_keys]
        d.log_batch(r.info.run_id, metrics=latest + history[k.info.run_id],
                    params=[Param(a, b) for a, b in k.data.params.items()])
        d.set_terminated(r.info.run_id, "FINISHED")
    d.set_terminated(parent.info.run_id, "FINISHED")
    print(f"{children} children written to {dest} in {time.time() - t0:.1f} s")
    read(dest, name)


def read(uri: str, sweep: str, readers: int | None = None) -> None:
    from scalelab.scaling.collect import collect_runs
    from scalelab.tracking import sweep as sweep_store

    if readers:  # concurrent history requests against a server (1: one at a time)
        sweep_store.HISTORY_READERS = readers
    t0 = time.time()
    runs, curves = collect_runs(sweep, None, uri, "matmul", "attention")
    print(f"collect_runs({sweep!r}) from {uri}: {len(runs)} runs, {len(curves)} curve rows "
          f"in {time.time() - t0:.1f} s")


# the runs table's rows (MLflow 3's runs grid) and whether one names the parent run
ROWS_JS = """(() => { const rows = [...document.querySelectorAll('.ag-row')];
  return [new Set(rows.map(r => r.getAttribute('row-index'))).size,
          rows.some(r => r.innerText.includes(%s))]; })()"""


def ui(uri: str, sweep: str, timeout: float = 60.0) -> None:
    """Seconds from navigating to the experiment's run list until its table shows the parent
    run, then from clicking the parent's expand button until its children's rows show."""
    import json

    from mlflow.tracking import MlflowClient

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ui_screenshot import EXPAND_JS, Chromium

    exp = MlflowClient(uri).get_experiment_by_name(f"sweep_{sweep}")
    if exp is None:
        sys.exit(f"no experiment sweep_{sweep} in {uri}")
    url = f"{uri}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
    rows_js = ROWS_JS % json.dumps(f"sweep_{sweep}")

    def wait(done) -> tuple[float, int]:
        t0 = time.time()
        while time.time() - t0 < timeout:
            rows, parent = chrome.js(rows_js) or (0, False)
            if done(rows, parent):
                return time.time() - t0, rows
            time.sleep(0.05)
        return float("nan"), rows

    chrome = Chromium(1500, 900)
    try:
        target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
        chrome.session = chrome.call("Target.attachToTarget", targetId=target,
                                     flatten=True)["sessionId"]
        chrome.call("Page.enable")
        for load in ("first load", "second load"):
            chrome.call("Page.navigate", url="about:blank")
            chrome.call("Page.navigate", url=url)
            shown, _ = wait(lambda rows, parent: parent)
            chrome.js(EXPAND_JS)
            expanded, rows = wait(lambda rows, parent: rows > 1)
            print(f"{load}: parent row after {shown:.2f} s; {rows} rows {expanded:.2f} s after "
                  f"expanding it   [{url}]")
    finally:
        chrome.close()


def outage(uri: str, steps: int, down_s: float, cluster_dir: Path) -> None:
    """One scalelab-train run; after 20 logged steps the server is stopped for ``down_s`` and
    started again by cluster_up.sh; then the run's rows are counted."""
    from mlflow.tracking import MlflowClient

    repo = Path(__file__).resolve().parents[1]
    client = MlflowClient(uri)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        train = subprocess.Popen(
            [sys.executable, "-m", "scalelab.cli.train", "model=gpt2_tiny", "data=pystdlib",
             "data.max_bytes=200000", "tokenizer=byte", "train.global_batch_size=4", "model.max_seq_len=32",
             f"train.max_steps={steps}", "train.val_every=100", "train.val_batches=1",
             "trainer.log_every_n_steps=1", "callbacks.sample.enabled=false",
             "logger.log_checkpoint=false", "logger.metrics_interval_s=0",
             "trainer.enable_progress_bar=false", f"logger.tracking_uri={uri}",
             f"logger.experiment_name=outage_{int(time.time())}", f"paths.output_dir={run_dir}",
             f"paths.log_dir={tmp}/outputs"], cwd=repo, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            rid_file = run_dir / "mlflow_run_id"
            while not (rid_file.is_file() and rid_file.read_text().strip()
                       and len(client.get_metric_history(rid_file.read_text().strip(),
                                                         "train/loss")) >= 20):
                assert train.poll() is None, train.communicate()[0][-2000:]
                time.sleep(0.5)
            rid = rid_file.read_text().strip()
            pid = int((cluster_dir / "mlflow" / "server.pid").read_text())
            os.killpg(pid, 15)  # cluster_up.sh starts the server in its own process group
            t0 = time.time()
            time.sleep(down_s)
            subprocess.run(["bash", str(repo / "scripts" / "cluster_up.sh")], check=True,
                           capture_output=True, env=dict(os.environ, SCALELAB_CLUSTER_DIR=str(cluster_dir)))
            print(f"server down for {time.time() - t0:.0f} s")
            out, _ = train.communicate(timeout=1800)
        finally:
            if train.poll() is None:
                train.kill()
    print(f"train exit code {train.returncode}; "
          + "; ".join(ln for ln in out.splitlines() if "is back after" in ln))
    print(f"run {rid}: {client.get_run(rid).info.status}")
    for key in ("train/loss", "tokens_seen"):
        got = [m.step for m in client.get_metric_history(rid, key)]
        print(f"{key}: {len(got)} rows, {len(set(got))} distinct steps, "
              f"{len(set(range(steps)) - set(got))} of {steps} steps missing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["writers", "store", "read", "ui", "outage"])
    ap.add_argument("--uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--from-sweep", default="slurm1")
    ap.add_argument("--children", type=int, default=500)
    ap.add_argument("--to", default=None)
    ap.add_argument("--sweep", default="big500", help="read: the sweep to time collect_runs on")
    ap.add_argument("--steps", type=int, default=300, help="outage: the run's steps")
    ap.add_argument("--down-s", type=float, default=25.0, help="outage: seconds the server is down")
    ap.add_argument("--readers", type=int, default=None,
                    help="read: concurrent history requests (default: collect's own)")
    a = ap.parse_args()
    if not a.uri:
        ap.error("set MLFLOW_TRACKING_URI or pass --uri")
    if a.what == "writers":
        writers(a.uri, a.writers, a.rows)
    elif a.what == "outage":
        outage(a.uri, a.steps, a.down_s, Path(os.environ.get("SCALELAB_CLUSTER_DIR", ".cluster")))
    elif a.what == "read":
        read(a.uri, a.sweep, a.readers)
    elif a.what == "ui":
        ui(a.uri, a.sweep)
    else:
        store(a.uri, a.to or a.uri, a.from_sweep, a.children)


if __name__ == "__main__":
    main()
