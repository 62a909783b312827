"""Inputs that used to end in a traceback, through real processes: one `error:` line, exit 2,
and no MLflow run left behind; a --multirun whose job is refused marks its parent FAILED."""

from __future__ import annotations

import resource
import sqlite3
from pathlib import Path

import pytest
from tests.conftest import free_port

from scalelab.cli.eval import main as eval_main
from scalelab.cli.sample import main as sample_main

TINY = ["model=gpt2_tiny", "data=pystdlib", "data.max_bytes=100000", "tokenizer=byte",
        "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32",
        "train.max_steps=2", "callbacks.sample.enabled=false"]


def _one_error_line(r) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.stderr[-3000:]
    return errors[0]


def _runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT name, status FROM runs ORDER BY start_time").fetchall()


@pytest.mark.slow
def test_a_truncated_mlruns_db_is_one_line_naming_it(tmp_path: Path, train_cli) -> None:
    args = [*TINY, *train_cli.isolated(tmp_path)]  # a migrated store at tmp_path/mlruns.db
    db = tmp_path / "mlruns.db"  # other damage: tests/tracking/test_store_check_and_redact.py
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    line = _one_error_line(train_cli.run(*args))
    assert str(db) in line and "logger.tracking_uri" in line and "truncated" in line
    assert ".broken" in line  # the fix
    assert not list((tmp_path / "outputs").rglob(".hydra"))


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_is_never_printed(tmp_path: Path, train_cli) -> None:
    uri = f"http://bob:hunter2@127.0.0.1:{free_port()}"  # nothing listens there
    env = train_cli.env(MLFLOW_TRACKING_URI=uri)
    args = [a for a in [*TINY, *train_cli.isolated(tmp_path)] if not a.startswith("logger.tracking_uri")]
    r = train_cli.run(*args, "logger.probe_timeout=1", env=env)
    line = _one_error_line(r)
    assert "bob:***@127.0.0.1" in line and "$MLFLOW_TRACKING_URI" in line
    assert "hunter2" not in r.stdout + r.stderr


@pytest.mark.slow
def test_out_of_memory_is_one_line_and_the_run_is_failed(tmp_path: Path, train_cli) -> None:
    def small_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    # the first block's fused qkv alone is 65,536 x 196,608 floats (51 GB): the allocator fails
    # at once, instead of after filling 8 GB with initial weights
    args = [*TINY, *train_cli.isolated(tmp_path), "model.d_model=65536", "model.n_heads=16"]
    import subprocess

    r = subprocess.run(train_cli.cmd(*args), env=train_cli.env(), capture_output=True, text=True,
                       timeout=300, preexec_fn=small_address_space)
    line = _one_error_line(r)
    assert "out of memory" in line and "train.micro_batch_size" in line
    assert [status for _, status in _runs(tmp_path / "mlruns.db")] == ["FAILED"]


@pytest.mark.slow
def test_a_multirun_with_refused_jobs_marks_its_parent_failed(tmp_path: Path, train_cli) -> None:
    args = [a for a in [*TINY, *train_cli.isolated(tmp_path)] if not a.startswith("model.n_layers")]
    r = train_cli.run("-m", *args, "model.n_layers=0,-1", f"paths.root={tmp_path}", "run_name=mr",
                      "+tags.db=postgresql://bob:hunter2@db.example/runs",
                      env=train_cli.env(HYDRA_FULL_ERROR="0"))  # Hydra's report as a user sees it
    assert r.returncode != 0
    assert _runs(tmp_path / "mlruns.db") == [("mr (multirun)", "FAILED")]
    # the failed job is one line saying what was recorded, not Hydra's traceback
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "n_layers=0" in errors[0], r.stderr[-3000:]
    assert "job 0 was refused before its run started" in errors[0]
    assert "parent run 'mr (multirun)' is FAILED" in errors[0]
    assert "Error executing job" in r.stderr and "hunter2" not in r.stdout + r.stderr
    # Hydra's copies of the multirun's config keep no password (cli/hydra_copies.py)
    copies = list((tmp_path / "multirun").rglob("*.yaml"))
    assert any(p.name == "multirun.yaml" for p in copies)
    assert not [p for p in copies if "hunter2" in p.read_text()]


@pytest.mark.parametrize(("main", "args", "needle"), [
    (sample_main, ["x.ckpt", "--max-new-tokens", "-5"], "--max-new-tokens: -5 is not a count >= 1"),
    (sample_main, ["x.ckpt", "--temperature", "-1"], "--temperature: -1.0 must be >= 0"),
    (eval_main, ["x.ckpt", "--tokens", "0"], "--tokens: 0 is not a count >= 1"),
])
def test_impossible_sample_and_eval_numbers_are_refused(main, args: list[str], needle: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and needle in capsys.readouterr().err
