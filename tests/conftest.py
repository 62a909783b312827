"""Shared test fixtures: the shared data folder, a real MLflow server, and a `scalelab-train` runner."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalelab.tracking.ui import server_env

# tests/ is not a package: pytest imports this file as ``conftest`` and test modules import its
# helpers as ``tests.conftest``. One module for both names keeps one migrated-store template and
# one token cache per worker, instead of a second of each.
sys.modules.setdefault("tests.conftest", sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# The xdist workers share the cores: every scalelab process a test starts plans its threads
# for that many processes (scalelab.runtime), instead of taking every core it sees idle.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("SCALELAB_CONCURRENT_PROCS", os.environ["PYTEST_XDIST_WORKER_COUNT"])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each xdist worker's share starts with its slow (end-to-end) tests, the quick ones after.

    `--dist worksteal` gives worker j the j-th contiguous block of this list (sizes
    remaining // workers left), and an idle worker steals from the end of another's block. The
    real-cluster tests (tests/cluster) head the first block together: they mostly wait on SLURM
    and share one node, so on one worker they neither wait for each other nor hold a second
    worker idle. The other slow tests are dealt out in turn to the heads of the other blocks (of
    every block with fewer than 3 workers), and the quick ones fill the rest: the workers end
    together on quick tests instead of one running a long test alone at the end."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    cluster = [i for i in slow if i.nodeid.startswith("tests/cluster/")]
    slow = [i for i in slow if i not in cluster]
    quick = [i for i in items if i.get_closest_marker("slow") is None]
    if workers == 1:
        items[:] = cluster + slow + quick
        return
    dealt_to = list(range(1, workers)) if workers >= 3 else list(range(workers))
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    heads[0] += cluster
    for k, item in enumerate(slow):
        heads[dealt_to[k % len(dealt_to)]].append(item)
    ordered: list[pytest.Item] = []
    for j in range(workers):
        size = (len(items) - len(ordered)) // (workers - j)
        block = heads[j][:size]
        take = size - len(block)
        block += quick[:take]
        del quick[:take]
        ordered += block
    placed = {id(i) for i in ordered}
    items[:] = ordered + [i for h in heads for i in h if id(i) not in placed] + quick


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """<repo>/../shared/data (tinyshakespeare.txt lives there); env SCALELAB_SHARED_DATA overrides."""
    d = Path(
        os.environ.get("SCALELAB_SHARED_DATA")
        or Path(__file__).resolve().parents[1].parent / "shared" / "data"
    )
    if not (d / "tinyshakespeare.txt").exists():
        pytest.fail(
            f"shared test data not found: {d}/tinyshakespeare.txt; set SCALELAB_SHARED_DATA "
            f"to the folder holding tinyshakespeare.txt"
        )
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """ONE real `mlflow server` (SQLite backend, proxied artifacts) for the whole session.

    Started on first use (5-10 s, ~0.5 GB: no job runner, as `make ui` runs it), stopped (its
    whole process group) at the end. Yields its URL, e.g. http://127.0.0.1:54321.
    """
    d = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    mlflow_bin = VENV_BIN / "mlflow"
    cmd = [
        str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "server",
        "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", sqlite_store(d / "mlflow.db"),
        "--artifacts-destination", str(d / "artifacts"),
        "--workers", "1",
    ]
    log = open(d / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=server_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail(f"mlflow server did not start: {(d / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


_STORE_TEMPLATE: list[Path] = []


def _store_template() -> Path:
    """One empty, fully migrated MLflow SQLite store per session (made by MLflow itself)."""
    if not _STORE_TEMPLATE:
        import atexit
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="scalelab-test-store-"))
        atexit.register(shutil.rmtree, d, True)
        code = ("import sys\nfrom mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore\n"
                "SqlAlchemyStore(sys.argv[1], sys.argv[2])")
        subprocess.run([sys.executable, "-c", code, f"sqlite:///{d / 'mlruns.db'}",
                        str(d / "artifacts")], check=True, capture_output=True, timeout=300)
        _STORE_TEMPLATE.append(d / "mlruns.db")
    return _STORE_TEMPLATE[0]


def sqlite_store(db: str | Path) -> str:
    """``sqlite:///<db>`` (``db`` a path or such a URI), seeded with the session's migrated store
    if the file is new.

    A new SQLite store runs MLflow's ~60 schema migrations (2-5 s of CPU) in the first process
    that opens it; every test that trains would pay that. A copy of one migrated store is the
    same real SQLite store, owned by the test. A file that exists is left alone."""
    path = Path(str(db).removeprefix("sqlite:///"))
    if not path.exists() and path.parent.is_dir():
        shutil.copyfile(_store_template(), path)
    return f"sqlite:///{path}"


def train_env(**extra: str) -> dict[str, str]:
    """Environment for a `scalelab-train` subprocess: no ambient MLflow URI, quiet, unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", TQDM_DISABLE="1")
    env.update(extra)
    return env


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.train", *overrides]


def run_train(*overrides: str, cwd: Path | None = None, timeout: float = 300,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `scalelab-train` in a subprocess and return the finished process (text output)."""
    return subprocess.run(
        train_cmd(*overrides), cwd=cwd or REPO, env=env or train_env(), capture_output=True,
        text=True, timeout=timeout,
    )


_SESSION_DATA_DIR: list[Path] = []


def session_data_dir() -> Path:
    """One token cache per test session, outside the repo (tests never write data_cache/)."""
    if not _SESSION_DATA_DIR:
        import atexit
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="scalelab-test-cache-"))
        atexit.register(shutil.rmtree, d, True)
        _SESSION_DATA_DIR.append(d)
    return _SESSION_DATA_DIR[0]


def isolated(tmp: Path, *, tracking_uri: str | None = None, data_dir: Path | None = None,
             seed_store: bool = True) -> list[str]:
    """Overrides that keep a test run's outputs and MLflow store in ``tmp``.

    The token cache defaults to one temp folder per session (prepared once, shared by tests).
    A SQLite store starts migrated (:func:`sqlite_store`); ``seed_store=False`` leaves it
    absent, for tests that check a refused command creates no store.
    """
    uri = tracking_uri or str(tmp / "mlruns.db")
    if not uri.startswith(("http:", "https:", "file:")):  # a SQLite path or URI
        uri = sqlite_store(uri) if seed_store else f"sqlite:///{uri.removeprefix('sqlite:///')}"
    return [
        f"paths.log_dir={tmp / 'outputs'}",
        f"paths.data_dir={data_dir or session_data_dir()}",
        f"logger.tracking_uri={uri}",
        f"logger.artifact_root={tmp / 'mlartifacts'}",
        "trainer.enable_progress_bar=false",
    ]


@pytest.fixture(scope="session")
def train_cli() -> object:
    """Helpers for tests that drive `scalelab-train` in subprocesses (no import paths needed):
    train_cli.run(*overrides, cwd=, timeout=, env=), .isolated(tmp, tracking_uri=), .env(**kw),
    .store(db) (a migrated SQLite store),
    .cmd(*overrides), .repo, .data_dir() (the session's token cache)."""
    import types

    return types.SimpleNamespace(run=run_train, isolated=isolated, store=sqlite_store,
                                 env=train_env, cmd=train_cmd, repo=REPO,
                                 data_dir=session_data_dir)
