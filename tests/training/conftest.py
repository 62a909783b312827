"""Fixtures for the training tests: tiny models, real corpora prepared once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from scalelab.data import DataConfig, PreparedData, TokenizerConfig, prepare


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    # Tiny models gain nothing from intra-op threads, and on a busy CI box (several test
    # processes on 2 cores) OpenMP threads spin against each other: 1 thread is ~10x faster.
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shakespeare_char(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    cache = tmp_path_factory.mktemp("train-cache")
    return prepare(
        DataConfig(name="shakespeare", path=str(shared_data_dir / "tinyshakespeare.txt")),
        TokenizerConfig(name="char"),
        cache,
        progress=False,
    )


def cpu_trainer(max_steps: int, tmp_path: Path | None = None, **kw) -> pl.Trainer:
    """A quiet single-CPU Trainer for tests (no logger unless given, no progress bar)."""
    args = {
        "max_steps": max_steps,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "deterministic": False,
    }
    if tmp_path is not None:
        args["default_root_dir"] = str(tmp_path)
    args.update(kw)
    return pl.Trainer(**args)
