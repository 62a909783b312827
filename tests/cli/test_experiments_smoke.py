"""Every named experiment (conf/experiment/*.yaml) runs short: `debug=limit` and
`debug=fast_dev_run` train each one for real (Lightning fit, checkpoint, summary).

One subprocess trains them all in turn (one interpreter start instead of one per experiment);
each experiment is then its own test case. Runs are shrunk further (3 steps, 4 sequences) so the
whole file stays cheap; warmups longer than that are capped by the schedule, not by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.paths import conf_dir

EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
SHRINK = ["train.max_steps=3", "train.val_every=2", "train.val_batches=1",
          "train.global_batch_size=4", "callbacks.sample.max_new_tokens=4",
          "data.max_bytes=400000", "logger=none", "trainer.enable_progress_bar=false"]

SCRIPT = """
import json, sys
from scalelab.cli.train import train
from scalelab.config.compose import compose
for name, debug, overrides in json.loads(sys.argv[1]):
    try:
        summary = train(compose("train", [f"+experiment={name}", f"debug={debug}", *overrides]))
        row = {"status": summary.get("status"), "steps": summary["metrics"].get("final/steps")}
    except BaseException as e:
        row = {"error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps({"key": f"{name}/{debug}", **row}), flush=True)
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, shared_data_dir: Path,
            train_cli) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("experiments")
    jobs = []
    for name in EXPERIMENTS:
        extra = [f"data.path={shared_data_dir / 'tinyshakespeare.txt'}"] \
            if name == "shakespeare_char" else []
        for debug in ("limit", "fast_dev_run"):
            jobs.append([name, debug, [*SHRINK, *extra, f"paths.data_dir={train_cli.data_dir()}",
                                       f"paths.output_dir={tmp / name / debug}"]])
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs)], env=train_cli.env(),
                       cwd=tmp, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert rows, r.stdout[-2000:] + r.stderr[-3000:]
    return {row["key"]: row for row in rows}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_runs_short(name: str, results: dict[str, dict]) -> None:
    limit, fast = results[f"{name}/limit"], results[f"{name}/fast_dev_run"]
    assert limit.get("status") == "FINISHED" and limit["steps"] == 3, limit
    assert fast.get("status") == "FINISHED" and fast["steps"] == 1, fast
