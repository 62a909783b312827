"""Every named experiment (conf/experiment/*.yaml) runs short: `debug=limit` and
`debug=fast_dev_run` train each one for real (Lightning fit, checkpoint, summary). So does every
model preset small enough for a CPU (conf/model/*.yaml under 5M parameters): the experiments
train most of them; the rest train here as they are, under `debug=limit`. The large presets
(gpt2, bert_base, transformer_base, llama_7b, gpt3) are built on torch's meta device and counted
against their recorded and published sizes instead (tests/model/test_presets.py).

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


def _experiment_model(name: str) -> str:
    """The model preset an experiment trains (its `override /model:` default)."""
    text = (conf_dir() / "experiment" / f"{name}.yaml").read_text()
    return text.split("override /model:", 1)[1].split()[0]


def _cpu_presets() -> list[str]:
    from scalelab.model.presets import PRESETS, preset, preset_dict

    return sorted(n for n in PRESETS
                  if preset(n, vocab_size=preset_dict(n)["vocab_size"] or 65).n_params() < 5e6)


# the CPU-sized presets no experiment trains: trained here as they are
PRESETS_HERE = sorted(set(_cpu_presets()) - {_experiment_model(e) for e in EXPERIMENTS})
SHRINK = ["train.max_steps=3", "train.val_every=2", "train.val_batches=1",
          "train.global_batch_size=4", "callbacks.sample.max_new_tokens=4",
          "data.max_bytes=400000", "logger=none", "trainer.enable_progress_bar=false"]

SCRIPT = """
import json, sys
from scalelab.cli.train import train
from scalelab.config.compose import compose
for key, overrides in json.loads(sys.argv[1]):
    try:
        summary = train(compose("train", overrides))
        row = {"status": summary.get("status"), "steps": summary["metrics"].get("final/steps")}
    except BaseException as e:
        row = {"error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps({"key": key, **row}), flush=True)
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
            jobs.append([f"{name}/{debug}", [
                f"+experiment={name}", f"debug={debug}", *SHRINK, *extra,
                f"paths.data_dir={train_cli.data_dir()}", f"paths.output_dir={tmp / name / debug}"]])
    for name in PRESETS_HERE:
        data = ["data=synthetic_seq2seq"] if name.startswith("transformer") else []
        jobs.append([f"model={name}", [
            f"model={name}", "debug=limit", *data, *SHRINK,
            f"paths.data_dir={train_cli.data_dir()}", f"paths.output_dir={tmp / 'model' / name}"]])
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


def test_every_cpu_sized_model_preset_trains(results: dict[str, dict]) -> None:
    """Each preset under 5M parameters trains: through its experiment, or here as it is."""
    trained = {_experiment_model(e): e for e in EXPERIMENTS}
    assert set(_cpu_presets()) == set(trained) | set(PRESETS_HERE)
    for name in _cpu_presets():
        row = results[f"{trained[name]}/limit" if name in trained else f"model={name}"]
        assert row.get("status") == "FINISHED" and row["steps"] == 3, (name, row)
