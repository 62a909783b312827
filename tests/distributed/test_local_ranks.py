"""Rank 0 starts its node's other ranks itself (real processes): the environment each rank sees,
the environment restored after the job, and a failed rank failing the whole job at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from scalelab.training import distributed

LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
DUMP_ENV = (f"import json, os, sys; json.dump({{k: os.environ.get(k) for k in {LAUNCH_ENV!r}}}, "
            "open(sys.argv[1], 'w'))")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in LAUNCH_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the user's value is kept, then restored


def test_ranks_get_lightnings_launch_env_and_the_job_end_restores_it(
        clean_env: None, tmp_path: Path) -> None:
    def child(rank: int):
        return [sys.executable, "-c", DUMP_ENV, str(tmp_path / f"rank{rank}.json")], str(tmp_path)

    assert distributed.starts_own_ranks(3)
    distributed.start_local_ranks(3, 2, child)
    mine = {k: os.environ.get(k) for k in LAUNCH_ENV}
    assert not distributed.starts_own_ranks(3)  # LOCAL_RANK=0: Lightning starts no process
    # as after a fit, this rank joined a process group: the others get time to finish
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    distributed.release_distributed(wait_s=60)

    assert (mine["LOCAL_RANK"], mine["NODE_RANK"], mine["WORLD_SIZE"]) == ("0", "0", "6")
    assert mine["MASTER_PORT"].isdigit()
    for rank in (1, 2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {**mine, "LOCAL_RANK": str(rank)}
    assert {k: os.environ.get(k) for k in LAUNCH_ENV} == {
        **dict.fromkeys(LAUNCH_ENV), "MASTER_ADDR": "127.0.0.1"}
    assert distributed._children == [] and distributed._saved_env is None


def test_one_process_per_node_starts_nothing(clean_env: None) -> None:
    assert not distributed.starts_own_ranks(1)


# Rank 0 of a job whose rank 1 fails while rank 2 still works.
FAILING_JOB = """
import logging, sys, time
from scalelab.training import distributed

logging.basicConfig()
commands = {1: "import sys; sys.exit(3)", 2: "import time; time.sleep(600)"}
distributed.start_local_ranks(3, 1, lambda rank: ([sys.executable, "-c", commands[rank]], None))
print(distributed._children[1].pid, flush=True)
time.sleep(600)
"""


def test_a_failed_rank_stops_every_rank_of_the_job_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    p = subprocess.run([sys.executable, "-c", FAILING_JOB], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "ERROR:scalelab.train:local rank 1 exited with code 3: see its *_rank1.log in the run "
        "folder; stopping every rank of this job")
    rank2 = int(p.stdout.split()[0])
    deadline = time.monotonic() + 60  # init reaps the orphan; the kill itself came first
    while os.path.exists(f"/proc/{rank2}") and time.monotonic() < deadline:
        with open(f"/proc/{rank2}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.2)
    else:
        assert not os.path.exists(f"/proc/{rank2}"), "rank 2 outlived the failed job"
