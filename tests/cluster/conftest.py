"""A real single-node SLURM, an MLflow server on PostgreSQL and an Optuna database beside it,
started by the project's own scripts (scripts/cluster_up.sh, scripts/cluster_down.sh) once per
pytest run.

Under pytest-xdist the workers share one cluster: the first to arrive brings it up, the last to
leave takes it down (a counter under a file lock in the session's shared temp folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd")


@dataclass
class Cluster:
    folder: Path
    tracking_uri: str
    slurm_conf: str
    optuna_storage: str  # a PostgreSQL database of its own; the password is in pgpass_file
    pgpass_file: str

    def up(self) -> subprocess.CompletedProcess[str]:
        """scripts/cluster_up.sh again: it starts whatever part is not running (slurmd)."""
        return _script("cluster_up.sh", self.folder)

    @contextlib.contextmanager
    def node(self, exclusive: bool) -> Iterator[None]:
        """A test that takes the node down holds it exclusively; one whose jobs must not meet
        a node failure shares it (the xdist workers share one cluster)."""
        with open(self.folder / "node.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def crash_node(self, job_ids: list[str]) -> list[int]:
        """What a node crash does to these jobs: slurmd and every process of the jobs (their
        slurmstepd and all below) stopped, then killed, before any of them could report. Only
        this cluster's processes are touched (their environment names its slurm.conf)."""
        parent: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        roots = set()
        for pid in parent:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                step = cmd.split(b"\0")[0].removeprefix(b"slurmstepd: [").split(b".")[0]
                if (cmd.startswith(b"slurmstepd: [") and step.decode() in job_ids
                        and f"SLURM_CONF={self.slurm_conf}".encode() in env):
                    roots.add(pid)
        tree = set(roots)
        while grown := {p for p, pp in parent.items() if pp in tree} - tree:
            tree |= grown
        slurmd = int((Path(self.slurm_conf).parent / "slurmd.pid").read_text())
        victims = [slurmd, *sorted(tree)]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        return victims

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a command that submits jobs and tracks on the server: jobs
        inherit it (sbatch --export=ALL), PYTHONPATH included."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(MLFLOW_TRACKING_URI=self.tracking_uri, SLURM_CONF=self.slurm_conf,
                   SCALELAB_OPTUNA_STORAGE=self.optuna_storage, PGPASSFILE=self.pgpass_file,
                   PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", TQDM_DISABLE="1")
        env.update(extra)
        return env


def _script(name: str, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # two server workers: each is a Python process importing MLflow, on a CI machine's few cores
    env = dict(os.environ, SCALELAB_CLUSTER_DIR=str(folder), SCALELAB_PYTHON=sys.executable,
               SCALELAB_MLFLOW_WORKERS="2")
    return subprocess.run(["bash", str(REPO / "scripts" / name), *args], env=env, capture_output=True,
                          text=True, timeout=600)


def _unavailable() -> str | None:
    """Why the cluster cannot be started here (None: it can)."""
    missing = [p for p in PACKAGES if shutil.which(p) is None]
    if os.geteuid() != 0:
        return ("the SLURM cluster tests need root (SLURM's daemons run as root; "
                f"cluster_up.sh installs the Debian packages){'; missing: ' + ' '.join(missing) if missing else ''}")
    if missing and shutil.which("apt-get") is None:
        return f"no apt-get to install {' '.join(missing)} (Debian's slurm-wlm, slurmdbd, mariadb-server)"
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[Cluster]:
    why = _unavailable()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # one folder for all workers
    # outside pytest's private temp root: PostgreSQL runs as the postgres user
    folder = Path(tempfile.gettempdir()) / f"scalelab-cluster-{shared.name}"
    with open(shared / "cluster.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = shared / "cluster.users"
        n = int(users.read_text()) if users.exists() else 0
        r = _script("cluster_up.sh", folder)
        if r.returncode != 0:
            _script("cluster_down.sh", folder, "--purge")  # what did start
            if "apt-get install" in r.stderr:
                pytest.skip(f"the cluster packages could not be installed: {r.stderr.strip()}")
            pytest.fail(f"scripts/cluster_up.sh failed:\n{r.stdout}{r.stderr}")
        users.write_text(str(n + 1))
    lines = dict(ln.removeprefix("export ").split("=", 1) for ln in r.stdout.splitlines()
                 if ln.startswith("export "))
    try:
        yield Cluster(folder, lines["MLFLOW_TRACKING_URI"], lines["SLURM_CONF"],
                      lines["SCALELAB_OPTUNA_STORAGE"], lines["PGPASSFILE"])
    finally:
        with open(shared / "cluster.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = int(users.read_text()) - 1
            users.write_text(str(n))
            if n == 0:
                r = _script("cluster_down.sh", folder, "--purge")
                assert r.returncode == 0, r.stdout + r.stderr
