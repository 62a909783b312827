"""DDP ranks together see exactly the batch one process sees (what makes DDP == 1 process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scalelab.data import CausalLMDataModule, DataConfig, TokenizerConfig, prepare


class _Trainer:  # the two attributes the DataModule reads for sharding
    training = True

    def __init__(self, rank: int, world: int) -> None:
        self.global_rank, self.world_size = rank, world


@pytest.fixture(scope="module")
def prepared(shared_data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    return prepare(DataConfig(name="shakespeare", path=str(shared_data_dir / "tinyshakespeare.txt")),
                   TokenizerConfig(name="char"), tmp_path_factory.mktemp("cache"), progress=False)


def _batches(prepared, rank: int, world: int, micro: int, n: int = 3) -> list[torch.Tensor]:
    dm = CausalLMDataModule(prepared, block_size=16, batch_size=micro, seed=7)
    dm.trainer = _Trainer(rank, world)
    it = iter(dm.train_dataloader())
    return [next(it)["input_ids"] for _ in range(n)]


def test_two_ranks_split_the_one_process_global_batch(prepared):
    one = _batches(prepared, 0, 1, 8)
    r0, r1 = _batches(prepared, 0, 2, 4), _batches(prepared, 1, 2, 4)
    for b in range(3):
        assert torch.equal(torch.cat([r0[b], r1[b]]), one[b])
        assert not torch.equal(r0[b], r1[b])
