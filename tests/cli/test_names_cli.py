"""Through real `scalelab-train` processes: a run name with a comma, quotes and a space is kept,
and the resume command printed at SIGTERM runs as printed; an unsafe name or an unknown
`+train.X` key is one line with exit 2 and leaves no folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
TINY = ["model=gpt2_tiny", "data=pystdlib", "data.max_bytes=100000", "tokenizer=byte",
        "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32",
        "callbacks.sample.enabled=false"]


def test_the_printed_resume_command_runs_as_printed(tmp_path: Path, train_cli) -> None:
    tests_dir = Path(__file__).resolve().parents[1]  # `cli.sigterm_at_step` for the child
    env = train_cli.env(PYTHONPATH=os.pathsep.join(
        [str(tests_dir), os.environ.get("PYTHONPATH", "")]))
    name = "a,b c\"d'e"
    r = train_cli.run(*TINY, "train.max_steps=4", "train.val_every=2",
                      *train_cli.isolated(tmp_path), "logger=none",  # the name is the point here
                      f"run_name={_hydra_single_quoted(name)}",
                      "+callbacks.kill={_target_: cli.sigterm_at_step.SigtermAtStep, step: 2}",
                      env=env)
    assert r.returncode == 143, r.stderr[-3000:]
    command = next(ln for ln in r.stdout.splitlines() if ln.startswith("resume with: "))
    command = command.removeprefix("resume with: ")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = (tmp_path / "outputs").glob("*/*")
    assert folder.name.endswith(name)  # the name is kept as typed
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["resumed_from"] and summary["run_name"] == name


def _hydra_single_quoted(value: str) -> str:
    from scalelab.config.names import hydra_quoted

    return hydra_quoted(value)


@pytest.mark.parametrize(("override", "needle"), [
    ("run_name=../../escaped", "run_name='../../escaped': a folder-safe name"),
    ("+train.max_step=5", "train.max_step: no such key in train"),
])
def test_unsafe_names_and_unknown_keys_are_one_line(tmp_path: Path, train_cli, override: str,
                                                    needle: str) -> None:
    r = train_cli.run(*TINY, "train.max_steps=2", *train_cli.isolated(tmp_path / "root"), override)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], r.stderr[-3000:]
    assert not (tmp_path / "escaped").exists()
    assert not list((tmp_path / "root").rglob(".hydra"))
