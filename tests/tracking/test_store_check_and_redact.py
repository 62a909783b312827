"""A damaged or read-only SQLite store is named in one line before any run exists;
credentials in a tracking URI are redacted wherever it is printed; the UI warns when it is
served beyond loopback."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from scalelab.tracking.redact import redact
from scalelab.tracking.store_check import StoreUnusable, check_sqlite_store
from scalelab.tracking.ui import is_loopback
from scalelab.tracking.ui import main as ui_main


def _store(tmp_path: Path, train_cli) -> Path:
    return Path(train_cli.store(tmp_path / "mlruns.db").removeprefix("sqlite:///"))


@pytest.mark.parametrize(("damage", "needle"), [
    ("header", "not a SQLite database"),
    ("truncated", "truncated"),
    ("garbled_pages", "not a usable SQLite database"),
])
def test_damaged_stores_are_named_with_the_fix(tmp_path: Path, train_cli, damage: str,
                                               needle: str) -> None:
    db = _store(tmp_path, train_cli)
    uri = f"sqlite:///{db}"
    check_sqlite_store(uri)  # the migrated store itself is fine
    data = bytearray(db.read_bytes())
    if damage == "header":
        data[:100] = b"\0" * 100
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # the pages after the header: the schema no longer reads
        data[4096:4096 * 24] = b"\xa5" * (4096 * 23)
    db.write_bytes(bytes(data))
    with pytest.raises(StoreUnusable) as e:
        check_sqlite_store(uri)
    assert needle in str(e.value) and str(db) in str(e.value) and ".broken" in str(e.value)


def test_a_read_only_store_is_named(tmp_path: Path, train_cli) -> None:
    db = _store(tmp_path, train_cli)
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ro)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        (ro / "mlruns.db").write_bytes(db.read_bytes())
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        with pytest.raises(StoreUnusable, match="is read-only"):
            check_sqlite_store(f"sqlite:///{ro / 'mlruns.db'}")
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize(("text", "shown"), [
    ("http://bob:hunter2@mlflow:5000", "http://bob:***@mlflow:5000"),
    ("postgresql://u:p%40ss@db/mlflow", "postgresql://u:***@db/mlflow"),
    ("error: https://a:b@c/x and http://d:e@f", "error: https://a:***@c/x and http://d:***@f"),
    ("http://bob:p@ss@host/x", "http://bob:***@host/x"),
    ("sqlite:////tmp/a:b/mlruns.db", "sqlite:////tmp/a:b/mlruns.db"),  # no credentials
    ("http://user@host:5000", "http://user@host:5000"),
])
def test_credentials_are_redacted(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_the_ui_warns_when_served_beyond_loopback(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert ui_main(["--host", "0.0.0.0", "--dry-run"]) == 0
    assert "no authentication" in capsys.readouterr().err
    assert ui_main(["--host", "127.0.0.1", "--dry-run"]) == 0
    assert "no authentication" not in capsys.readouterr().err


def test_a_multirun_parent_keeps_its_worst_jobs_outcome(tmp_path: Path, train_cli) -> None:
    from scalelab.tracking.parent_status import record_job_outcome
    from scalelab.tracking.run import client_for

    client = client_for(train_cli.store(tmp_path / "mlruns.db"))
    parent = client.create_run(client.create_experiment("x")).info.run_id
    for job_status, shown in [("FINISHED", "FINISHED"), ("FAILED", "FAILED"),
                              ("FINISHED", "FAILED"), ("KILLED", "FAILED")]:
        record_job_outcome(client, parent, job_status, tmp_path)  # jobs ending one after another
        assert client.get_run(parent).info.status == shown


def test_deeper_damage_is_one_line_where_the_run_opens_the_store(tmp_path: Path, train_cli) -> None:
    import sqlite3

    from scalelab.cli.tracking_setup import probe_tracking
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec

    db = _store(tmp_path, train_cli)
    with contextlib.closing(sqlite3.connect(db)) as c:
        page = c.execute("PRAGMA page_size").fetchone()[0]
        root = c.execute("SELECT rootpage FROM sqlite_master WHERE name='experiments'").fetchone()[0]
    with db.open("r+b") as f:  # one garbled table page: header and schema still read fine
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)
    uri = f"sqlite:///{db}"
    check_sqlite_store(uri)  # the cheap check at every start does not see it...
    spec = build_spec(compose("train", [f"logger.tracking_uri={uri}", f"paths.root={tmp_path}"]))
    with pytest.raises(StoreUnusable) as e:  # ...the run's checks open the store: one line
        probe_tracking(spec, uri)
    msg = str(e.value)
    assert f"{db} is damaged" in msg and "malformed" in msg and f"{db}.broken" in msg
    assert "\n" not in msg
