"""Tracker against an embedded SQLite store: statuses, resume dedup, parent runs, the fast probe."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scalelab.tracking.store import experiment_artifact_location, probe, resolve_tracking_uri


def test_probe_of_a_dead_server_fails_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listening is a wrong or dead URI: refused on the first try, never retried as a
    busy server would be (the retries' warning is the sign of a wait)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level("WARNING"), pytest.raises(RuntimeError, match="unreachable"):
        probe(f"http://127.0.0.1:{port}", timeout=30.0)
    assert "slow to answer" not in caplog.text


def test_local_stores_are_not_probed_and_paths_are_absolute(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    probe(f"sqlite:///{tmp_path}/x.db")
    assert resolve_tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert resolve_tracking_uri(None, tmp_path) == "http://example:5000"
    assert resolve_tracking_uri("sqlite:///a.db", tmp_path) == "sqlite:///a.db"
    loc = experiment_artifact_location("sqlite:///x.db", str(tmp_path / "arts"), "my exp/1")
    assert loc == (tmp_path / "arts" / "my_exp_1").as_uri()
    assert experiment_artifact_location("http://h:1", str(tmp_path), "e") is None


@pytest.mark.slow
def test_tracker_statuses_parent_and_resume(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from scalelab.tracking.run import Tracker

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    arts = str(tmp_path / "mlartifacts")

    def start(**kw):
        return Tracker.start(uri, "unit", "r", {"k": "v"}, artifact_root=arts, **kw)

    ok = start()
    with ok.status_guard():
        ok.log_params({"a": 1, "b": None})
        ok.log_metrics({"x": 1.0}, step=1)
    client = MlflowClient(uri)
    run = client.get_run(ok.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"a": "1", "b": "None"}
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())

    failed = start(parent_run_id=ok.run_id)
    with pytest.raises(ValueError), failed.status_guard():
        raise ValueError("boom")
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.data.tags["mlflow.parentRunId"] == ok.run_id

    killed = start()
    with pytest.raises(KeyboardInterrupt), killed.status_guard():
        raise KeyboardInterrupt
    assert client.get_run(killed.run_id).info.status == "KILLED"

    # resume: same run, params kept, steps already logged are skipped by the Lightning logger
    first = start()
    first.log_params({"lr": 0.1})
    logger = first.lightning_logger()
    logger.log_metrics({"train/loss": 3.0}, step=1)
    logger.log_metrics({"train/loss": 2.0}, step=2)
    first.spool.wait()  # MLflow's logging thread has written them (a resume follows a run's end)
    again = start(resume_run_id=first.run_id)
    assert again.run_id == first.run_id and again.resumed
    again.log_params({"lr": 0.2})  # ignored: mlflow forbids changing a param
    logger = again.lightning_logger()
    logger.log_metrics({"train/loss": 9.0}, step=2)  # replayed step after the checkpoint
    logger.log_metrics({"train/loss": 1.0}, step=3)
    again.spool.wait()
    hist = sorted((m.step, m.value) for m in client.get_metric_history(first.run_id, "train/loss"))
    assert hist == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert client.get_run(first.run_id).data.params["lr"] == "0.1"
    with pytest.raises(RuntimeError, match="not in"):
        start(resume_run_id="0" * 32)
    # the same name again is the k-th run of that name; a resume keeps the run's name
    assert [ok.run_name, failed.run_name, killed.run_name, first.run_name] == [
        "r", "r #2", "r #3", "r #4"]
    assert again.run_name == "r #4"


def test_a_sweep_point_trained_again_takes_its_name_back(tmp_path: Path) -> None:
    """The run folder of a sweep point is runs/<point>: its new run is <point> in MLflow too,
    and the earlier runs of the point say which attempt they were."""
    from mlflow.tracking import MlflowClient
    from tests.conftest import sqlite_store

    from scalelab.tracking.run import Tracker

    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep_x", artifact_location=str(tmp_path / "a"))
    parent = client.create_run(exp, run_name="sweep_x").info.run_id

    def earlier(name: str, point: str, status: str) -> str:
        run = client.create_run(exp, run_name=name, tags={
            "mlflow.parentRunId": parent, "sweep_point_id": point})
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status)
        return run.info.run_id

    failed = earlier("p001_ab", "ab", "FAILED")
    killed = earlier("p001_ab #2", "ab", "KILLED")  # as a repeat was named before
    other = earlier("p001_ab #3", "cd", "FAILED")  # another point's run: not an attempt of ab
    retry = Tracker.start(uri, "sweep_x", "p001_ab", {"sweep_point_id": "ab"},
                          parent_run_id=parent)
    live = Tracker.start(uri, "sweep_x", "p001_ab", {"sweep_point_id": "ab"},
                         parent_run_id=parent)  # `retry` still runs: it keeps its name
    assert [retry.run_name, live.run_name] == ["p001_ab", "p001_ab #2"]
    names = [client.get_run(r).info.run_name for r in (failed, killed, other)]
    assert names == ["p001_ab (attempt 1)", "p001_ab (attempt 2)", "p001_ab #3"]


def test_a_repeated_name_takes_the_first_free_number(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tests.conftest import sqlite_store

    from scalelab.tracking.run_names import unique_run_name

    client = MlflowClient(sqlite_store(tmp_path / "mlruns.db"))
    exp = client.create_experiment("names", artifact_location=str(tmp_path / "a"))
    assert unique_run_name(client, exp, "a_b,lr=0.1") == "a_b,lr=0.1"
    for name in ("a_b,lr=0.1", "aXb,lr=0.1 #2", "a_b,lr=0.1 #2x"):  # LIKE's `_` matches X
        client.create_run(exp, run_name=name)
    assert unique_run_name(client, exp, "a_b,lr=0.1") == "a_b,lr=0.1 #2"
    gone = client.create_run(exp, run_name="a_b,lr=0.1 #2")
    client.delete_run(gone.info.run_id)  # a deleted run can be restored: its name stays taken
    assert unique_run_name(client, exp, "a_b,lr=0.1") == "a_b,lr=0.1 #3"


def test_metric_values_are_sent_at_most_every_interval_in_order_and_never_lost(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient
    from tests.conftest import sqlite_store

    from scalelab.tracking.run import Tracker

    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)

    def steps(tracker: Tracker) -> list[int]:
        tracker.spool.wait()  # the batch MLflow's logging thread may still be writing
        return sorted(m.step for m in client.get_metric_history(tracker.run_id, "train/loss"))

    held = Tracker.start(uri, "unit", "held", {}, artifact_root=str(tmp_path / "a"),
                         metrics_interval_s=3600.0)
    held.log_params({"lr": 0.1})  # calls before the first metric values do not start the interval
    logger = held.lightning_logger()
    logger.log_metrics({"train/loss": 3.0}, step=1)
    assert steps(held) == [1]  # the first values go out at once: the UI shows the run has started
    for step in range(2, 6):
        logger.log_metrics({"train/loss": 3.0 - step / 10}, step=step)
    assert steps(held) == [1]  # held until the interval has passed
    held.set_tags({"phase": "val"})  # any other call sends the held values first
    assert steps(held) == [1, 2, 3, 4, 5]
    logger.log_metrics({"train/loss": 1.0}, step=6)
    with held.status_guard():
        pass
    assert steps(held) == [1, 2, 3, 4, 5, 6]  # ending the run sends the rest
    assert client.get_run(held.run_id).info.status == "FINISHED"

    timed = Tracker.start(uri, "unit", "timed", {}, artifact_root=str(tmp_path / "a"),
                          metrics_interval_s=2.0)  # two calls apart even on a loaded machine
    logger = timed.lightning_logger()
    logger.log_metrics({"train/loss": 3.0}, step=1)
    logger.log_metrics({"train/loss": 2.0}, step=2)
    assert steps(timed) == [1]
    time.sleep(2.1)
    logger.log_metrics({"train/loss": 1.0}, step=3)  # the interval has passed: 2 and 3 go together
    assert steps(timed) == [1, 2, 3]
    timed.end("KILLED")


def test_a_metric_batch_mlflow_rejects_is_raised_at_the_next_wait(tmp_path: Path,
                                                                  mlflow_server: str) -> None:
    """A tracking server's metric batches go through MLflow's logging thread; a real refusal
    surfaces at the next wait. A local SQLite store is written directly and refuses at once."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from tests.conftest import sqlite_store

    from scalelab.tracking.run import Tracker

    tracker = Tracker.start(mlflow_server, "unit", "deleted", {})
    MlflowClient(mlflow_server).delete_run(tracker.run_id)
    tracker.log_metrics({"x": 1.0}, step=1)  # handed to MLflow's logging thread
    assert tracker.spool._in_flight is not None
    with pytest.raises(MlflowException, match="active"):
        tracker.spool.wait()  # a live store's refusal is an error, not an outage to wait out
    assert not tracker.spool.pending

    uri = sqlite_store(tmp_path / "mlruns.db")
    local = Tracker.start(uri, "unit", "deleted", {}, artifact_root=str(tmp_path / "a"))
    MlflowClient(uri).delete_run(local.run_id)
    with pytest.raises(MlflowException, match="active"):
        local.log_metrics({"x": 1.0}, step=1)
    assert local.spool._in_flight is None and not local.spool.pending


def test_probe_asks_a_busy_server_again_and_passes_once_it_answers() -> None:
    """A server that answers 503 while busy (many jobs starting at once) is asked again with
    backoff; the probe passes when it answers, and fails with one line if it never does."""
    import http.server
    import threading

    answers = [503, 503, 200]
    seen: list[int] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = answers[min(len(seen), len(answers) - 1)]
            seen.append(code)
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        probe(uri, timeout=60.0)
        assert seen == [503, 503, 200]
        answers[:] = [503]  # busy for good: the deadline ends it, with the last answer named
        with pytest.raises(RuntimeError, match="unreachable: HTTP 503"):
            probe(uri, timeout=1.0)
    finally:
        server.shutdown()
        server.server_close()
