"""Run by test_ddp.py in a subprocess: 2-process CPU DDP (gloo) with the real module.

Prints one JSON line per rank: tokens_seen, val metrics, sample, perf metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the helpers

from scalelab.training import ThroughputMonitor
from scalelab.training.callbacks import THROUGHPUT_KEYS
from scalelab.training.distributed import release_distributed
from training.test_callbacks import CharTok, loader, tiny_module


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = tiny_module(6, tokenizer=CharTok(), sample_tokens=5, sample_prompt="ab")
    monitor = ThroughputMonitor(every_n_steps=2)
    trainer = pl.Trainer(
        max_steps=6, accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[monitor], val_check_interval=3, limit_val_batches=2, num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    trainer.fit(module, loader(200, 4), loader(16, 4))
    perf = {k: float(v) for k, v in trainer.callback_metrics.items() if k in THROUGHPUT_KEYS}
    # One file per rank: both ranks share stdout, where their lines can interleave.
    Path(f"result_rank{trainer.global_rank}.json").write_text(json.dumps({
        "rank": trainer.global_rank, "world": trainer.world_size, "tokens_seen": module.tokens_seen,
        "val": module.last_val, "sample": module.last_sample, "perf": perf,
    }))


if __name__ == "__main__":
    main()
    # As the platform's ranks end a job, once the trainer is garbage: the group and gloo's
    # threads gone before the interpreter exits (else the process can abort with -6).
    release_distributed()
