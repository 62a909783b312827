"""Two multirun jobs ending at the same instant: the parent's status is read and written by one
job at a time, so a FINISHED job can never overwrite the FAILED that another job just recorded.

The interleaving is forced, not hoped for: the test plays job A inside its update (it holds the
multirun folder's status lock), and job B is a real process calling ``record_job_outcome``. B
must wait on the lock (seen in /proc/locks) until A has written FAILED; B's FINISHED then keeps
the parent FAILED."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab.data.files import locked
from scalelab.tracking.parent_status import STATUS_LOCK
from scalelab.tracking.run import client_for

JOB_B = """
import sys
from pathlib import Path
from scalelab.tracking.parent_status import record_job_outcome
from scalelab.tracking.run import client_for
record_job_outcome(client_for(sys.argv[1]), sys.argv[2], "FINISHED", Path(sys.argv[3]))
"""


def _waits_on(lock: Path, pid: int) -> bool:
    """Whether process ``pid`` is blocked on an flock of ``lock`` (a ``->`` line of /proc/locks)."""
    inode = os.stat(lock).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 4] == str(pid) \
                and fields[fields.index("->") + 5].endswith(f":{inode}"):
            return True
    return False


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="needs Linux /proc/locks")
def test_a_job_ending_during_another_jobs_update_waits_and_keeps_the_worst(
        tmp_path: Path, train_cli) -> None:
    uri = train_cli.store(tmp_path / "mlruns.db")
    client = client_for(uri)
    parent = client.create_run(client.create_experiment("mr")).info.run_id
    lock = tmp_path / STATUS_LOCK
    with locked(lock):  # job A: read RUNNING, about to write FAILED
        job_b = subprocess.Popen([sys.executable, "-c", JOB_B, uri, parent, str(tmp_path)],
                                 env=train_cli.env())
        try:
            deadline = time.monotonic() + 240  # a bound for a loaded machine, not a timing
            while not _waits_on(lock, job_b.pid):
                assert job_b.poll() is None, "job B updated the parent without waiting for job A"
                assert time.monotonic() < deadline, "job B never reached the parent's status"
                time.sleep(0.05)
            client.set_terminated(parent, "FAILED")  # job A's write
        except BaseException:
            job_b.kill()
            raise
    try:
        assert job_b.wait(timeout=240) == 0
    finally:
        job_b.kill()
    assert client.get_run(parent).info.status == "FAILED"
