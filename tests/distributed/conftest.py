"""Session fixtures for the scale-out tests: one prepared data cache, one 1-process baseline run."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import run, run_folders, tiny_args, train_cmd

STEPS = 6  # optimizer steps of every tiny run here


@pytest.fixture(scope="session")
def data_file(shared_data_dir: Path) -> Path:
    return shared_data_dir / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dist_data_cache")


@pytest.fixture(scope="session")
def single_run(tmp_path_factory: pytest.TempPathFactory, data_file: Path, data_cache: Path) -> Path:
    """1 process, global batch 8 (micro 8), STEPS steps: the reference for DDP and FSDP tests."""
    work = tmp_path_factory.mktemp("single")
    run(train_cmd(*tiny_args(work, data_file, data_cache, STEPS), "run_name=single"), work)
    (folder,) = run_folders(work)
    return folder
