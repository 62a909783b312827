"""`scalelab-train` takes its threads when the run starts and says so in its start banner
(real runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TINY = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "train.global_batch_size=4", "train.val_batches=1", "callbacks.sample.enabled=false",
        "logger.log_checkpoint=false", "data.max_bytes=200000", "train.max_steps=2")


def _threads_line(tmp_path: Path, train_cli, *overrides: str) -> str:
    r = train_cli.run(*TINY, *train_cli.isolated(tmp_path), *overrides,
                      env=train_cli.env(SCALELAB_CONCURRENT_PROCS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    log = next((tmp_path / "outputs").glob("*/*/train.log")).read_text()
    line = re.search(r"threads       : (.*)", log)
    assert line, log[:3000]
    return line.group(1)


@pytest.mark.slow
def test_the_banner_says_the_threads_the_run_took(tmp_path: Path, train_cli) -> None:
    line = _threads_line(tmp_path, train_cli, "train.num_threads=1")
    assert line.startswith("1 torch threads (") and "1 scalelab process(es)" in line, line


@pytest.mark.slow
def test_unfixed_threads_are_the_cores_over_the_processes_sharing_them(tmp_path: Path,
                                                                         train_cli) -> None:
    from scalelab.runtime import available_cores

    line = _threads_line(tmp_path, train_cli)
    assert line.startswith(f"{available_cores()} torch threads ("), line
