"""Seed every model test and run it on one thread.

The models here are tiny: with several threads, synchronising them costs more than the
maths, so each test runs single-threaded and restores the previous setting afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread() -> Iterator[None]:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
