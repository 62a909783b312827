"""No failure damages another run or leaves a trusted-but-broken file.

Real `scalelab-train` processes on a real finished run (trained once per module, copied per
test with its SQLite MLflow store): a `ckpt_path=` with another shape, a truncated last.ckpt, a
real 3 MB tmpfs that fills up. Each checks the folder, its config and its MLflow run byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TINY = [
    "model=gpt2_tiny", "data=pystdlib", "data.max_bytes=300000", "tokenizer=byte",
    "model.max_seq_len=32", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
    "train.global_batch_size=8", "train.val_batches=1", "train.num_threads=1",
    "train.val_every=5", "callbacks.sample.enabled=false", "logger.log_checkpoint=false",
    "logger.experiment_name=faults", "run_name=first",
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, train_cli) -> Path:
    """<base>/run: a FINISHED 10-step run (best, last, step_4 checkpoints) + <base>/mlruns.db."""
    base = tmp_path_factory.mktemp("finished")
    r = train_cli.run(*TINY, "train.max_steps=10", "train.save_at_steps=[4]",
                      f"paths.output_dir={base / 'run'}",
                      *train_cli.isolated(base, tracking_uri=f"sqlite:///{base / 'mlruns.db'}"),
                      timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return base


def _copy(base: Path, tmp: Path, train_cli) -> tuple[Path, list[str]]:
    """A private copy of the finished run and its store; the overrides that point at them."""
    shutil.copytree(base / "run", tmp / "run")
    shutil.copy(base / "mlruns.db", tmp / "mlruns.db")
    return tmp / "run", train_cli.isolated(tmp, tracking_uri=f"sqlite:///{tmp / 'mlruns.db'}")


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _mlflow(tmp: Path) -> list[tuple[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlruns.db'}")
    exp = client.get_experiment_by_name("faults")
    return [(r.info.run_id, r.info.status) for r in client.search_runs([exp.experiment_id])]


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    # stderr without PYTHONPROFILEIMPORTTIME's lines, where a test asks for them
    err = "\n".join(line for line in r.stderr.splitlines() if not line.startswith("import time:"))
    assert r.returncode == 2, r.stdout[-2000:] + err[-3000:]
    assert "Traceback" not in err and "weights_only" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _imported(r: subprocess.CompletedProcess[str]) -> set[str]:
    """The top-level packages a process imported, from its ``PYTHONPROFILEIMPORTTIME`` lines."""
    return {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def test_ckpt_path_at_another_runs_checkpoint_with_another_shape_touches_nothing(
        finished_run: Path, tmp_path: Path, train_cli) -> None:
    run, where = _copy(finished_run, tmp_path, train_cli)
    before, runs_before = _snapshot(run), _mlflow(tmp_path)
    assert [s for _, s in runs_before] == ["FINISHED"]
    env = train_cli.env(PYTHONPROFILEIMPORTTIME="1")  # which modules the refusals import
    ckpt = run / "checkpoints" / "last.ckpt"
    r = train_cli.run(*TINY, "model.d_model=64", "train.max_steps=20", "run_name=second",
                      f"ckpt_path={ckpt}", *where, timeout=300, env=env)
    line = _one_line_error(r)
    # the run's config is compared first: each differing key with both values
    assert "model.d_model: 32 -> 64" in line and "ckpt_path=" in line, line
    # into a new folder, the checkpoint is matched against the model the data's vocabulary gives
    new = tmp_path / "new_run"
    r2 = train_cli.run(*TINY, "model.d_model=64", "train.max_steps=20", "run_name=second",
                       f"ckpt_path={ckpt}", f"paths.output_dir={new}", *where, timeout=300, env=env)
    line = _one_line_error(r2)
    assert "holds a model of shape [decoder d_model=32" in line and "d_model 32 vs 64" in line, line
    for refused in (r, r2):  # both before Lightning is imported
        assert "pytorch_lightning" not in _imported(refused)
    assert not new.exists()
    assert _snapshot(run) == before  # .hydra/config.yaml, summary.json, checkpoints: untouched
    assert _mlflow(tmp_path) == runs_before  # still FINISHED, no new run
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*"))


def test_finished_run_is_reopened_only_by_resume_with_more_steps(
        finished_run: Path, tmp_path: Path, train_cli) -> None:
    run, where = _copy(finished_run, tmp_path, train_cli)
    before, runs_before = _snapshot(run), _mlflow(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    env = train_cli.env(PYTHONPROFILEIMPORTTIME="1")  # which modules the refusals import
    same_length = train_cli.run(*TINY, "train.max_steps=10", f"ckpt_path={last}", *where, env=env)
    assert "FINISHED" in _one_line_error(same_length)
    no_new_steps = train_cli.run(*TINY, "train.max_steps=10", "resume=true",
                                 f"paths.output_dir={run}", *where, env=env)
    assert "nothing to add" in _one_line_error(no_new_steps)
    for refused in (same_length, no_new_steps):  # answered before the data, MLflow or Lightning
        assert not {"pytorch_lightning", "mlflow"} & _imported(refused)
    assert _snapshot(run) == before and _mlflow(tmp_path) == runs_before

    # a truncated last.ckpt (what a full disk used to leave): skipped, the newest good one is used
    last.write_bytes(last.read_bytes()[:50_000])
    truncated = _snapshot(run)
    older = train_cli.run(*TINY, "train.max_steps=10", "resume=true", f"paths.output_dir={run}",
                          *where)  # step_4.ckpt verifies, but re-training 4..10 adds nothing
    assert "FINISHED at step 10" in _one_line_error(older)
    assert _snapshot(run) == truncated and _mlflow(tmp_path) == runs_before
    r = train_cli.run(*TINY, "train.max_steps=14", "resume=true", f"paths.output_dir={run}",
                      "train.resume_schedule=continue", *where, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr  # Hydra's logging goes to stdout
    assert "skipped" in out and "last.ckpt (truncated" in out, out[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"].endswith(("best.ckpt", "step_4.ckpt")), summary["resumed_from"]
    assert summary["metrics"]["final/steps"] == 14 and summary["status"] == "FINISHED"
    assert _mlflow(tmp_path) == runs_before  # the same MLflow run, FINISHED again
    assert not (run / ".hydra.pending").exists()


def test_no_verified_checkpoint_is_one_line_and_touches_nothing(
        finished_run: Path, tmp_path: Path, train_cli) -> None:
    run, where = _copy(finished_run, tmp_path, train_cli)
    for ck in (run / "checkpoints").glob("*.ckpt"):
        ck.write_bytes(b"\0" * 100)
    before, runs_before = _snapshot(run), _mlflow(tmp_path)
    r = train_cli.run(*TINY, "train.max_steps=20", "resume=true", f"paths.output_dir={run}",
                      *where)
    line = _one_line_error(r)
    assert "no usable checkpoint" in line and "last.ckpt" in line, line
    assert _snapshot(run) == before and _mlflow(tmp_path) == runs_before


def test_full_disk_is_one_line_naming_the_path_and_the_run_is_failed(tmp_path: Path,
                                                                      train_cli) -> None:
    from scalelab.training.checkpoint import verify

    disk = tmp_path / "disk"
    disk.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {m.stderr.strip()}")
    try:
        run = disk / "run"
        # ~3 MB per checkpoint (weights + Adam state): the first fits, the second does not
        r = train_cli.run(*TINY, "model.d_model=96", "model.n_layers=2", "train.max_steps=30",
                          f"paths.output_dir={run}", *train_cli.isolated(tmp_path), timeout=300)
        line = _one_line_error(r)
        assert "No space left on device" in line and str(run / "checkpoints") in line, line
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "FAILED" and "No space left" in summary["error"]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
        assert client.get_run(summary["run_id"]).info.status == "FAILED"
        left = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert not [n for n in left if n.startswith(".")], left  # no temp file
        for ck in (run / "checkpoints").glob("*.ckpt"):
            assert verify(ck) is None, ck  # whatever is left is trusted AND whole
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_small_tmpdir_does_not_fail_checkpoints(tmp_path: Path, train_cli) -> None:
    """Checkpoints are staged next to their destination, not in $TMPDIR (a 1 MB tmpfs here)."""
    from scalelab.training.checkpoint import verify

    small = tmp_path / "tmpdir"
    small.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {m.stderr.strip()}")
    try:
        run = tmp_path / "run"
        r = train_cli.run(*TINY, "model.d_model=96", "model.n_layers=2", "train.max_steps=5",
                          f"paths.output_dir={run}", *train_cli.isolated(tmp_path),
                          env=train_cli.env(TMPDIR=str(small)), timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        last = run / "checkpoints" / "last.ckpt"
        assert last.stat().st_size > 2_000_000 and verify(last) is None  # 3 MB through a 1 MB $TMPDIR
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_sample_of_a_run_folder_skips_a_truncated_last_ckpt(finished_run: Path, tmp_path: Path,
                                                            train_cli) -> None:
    import sys

    run, _ = _copy(finished_run, tmp_path, train_cli)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    r = subprocess.run([sys.executable, "-m", "scalelab.cli.sample", str(run), "--max-new-tokens", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"skipped {last} (truncated" in r.stderr
