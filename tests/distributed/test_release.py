"""The end of a job on every rank: the process group dropped, failed ranks named, env restored."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from scalelab.training import distributed


def test_a_rank_that_launched_nothing_still_drops_its_process_group(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert distributed._saved_env is None  # not a launcher: rank 1 of a popen launch, torchrun
        distributed.release_distributed()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen]:
    """Three real child processes as the launcher records them, and the env it changed."""
    monkeypatch.setenv("MASTER_PORT", "29123")
    monkeypatch.setattr(distributed, "_saved_env", {"MASTER_PORT": None})
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in
             ("import sys; sys.exit(3)", "pass", "import time; time.sleep(60)")]
    monkeypatch.setattr(distributed, "_children", list(procs))
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_launcher_names_each_rank_that_failed_or_hung_and_restores_the_env(
        launched: list[subprocess.Popen], caplog: pytest.LogCaptureFixture) -> None:
    for proc in launched[:2]:  # ended before the launcher looks, however loaded the machine
        proc.wait(timeout=120)
    with caplog.at_level(logging.WARNING, logger="scalelab.train"):
        distributed.release_distributed(wait_s=1.0)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "local rank 1 exited with code 3: see its *_rank1.log in the run folder",
        "local rank 3 still ran 1 s after this one ended: killed it",
    ]
    assert launched[2].returncode is not None  # killed, not left behind
    assert "MASTER_PORT" not in os.environ and distributed._saved_env is None
    assert distributed._children == []
