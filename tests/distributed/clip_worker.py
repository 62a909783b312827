"""Run under torchrun (2 CPU processes, gloo): ``LMModule.configure_gradient_clipping`` under
FSDP1, the wrapper Lightning's FSDPStrategy uses, with each rank holding half of every parameter.

    python -m torch.distributed.run --standalone --nproc_per_node=2 clip_worker.py OUT.json

Lightning refuses FSDPStrategy on CPU, so the module gets a real FSDPStrategy whose ``model`` is
the real FSDP root, through a minimal trainer holder; everything the clipping touches is real.
Rank 0 writes the norm of the clipped gradients over both shards, and the norm an unsharded
copy of the same module reaches with torch's own clip_grad_norm_ on the same batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from pytorch_lightning.strategies import FSDPStrategy
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

from scalelab.model import ModelConfig
from scalelab.training import CausalLM, OptimConfig
from scalelab.training.distributed import release_distributed

CLIP = 0.05


def module() -> CausalLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)
    return CausalLM(cfg, OptimConfig(lr=1e-3, grad_clip=CLIP), total_steps=4)


def backward(m: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (4, 17), generator=g)
    logits = m({"input_ids": x[:, :-1]})
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).mul(50).backward()


def main(out: str) -> None:
    dist.init_process_group("gloo")
    lm = module()
    root = FullyShardedDataParallel(lm, device_id=torch.device("cpu"),
                                    sharding_strategy=ShardingStrategy.FULL_SHARD)
    strategy = FSDPStrategy()
    strategy.model = root
    lm._trainer = SimpleNamespace(strategy=strategy, precision_plugin=None, gradient_clip_val=None,
                                  barebones=True)  # self.log of grad_norm: a no-op here
    backward(root)
    before = float(root.clip_grad_norm_(float("inf")))  # the norm over both ranks, no change
    lm.configure_gradient_clipping(torch.optim.SGD(root.parameters(), lr=0.1))
    after = float(root.clip_grad_norm_(float("inf")))
    shard = sum(p.numel() for p in root.parameters()) / sum(p.numel() for p in module().parameters())
    if dist.get_rank() == 0:
        plain = module()
        backward(plain)
        ref_before = float(torch.nn.utils.clip_grad_norm_(plain.parameters(), CLIP))
        ref_after = float(torch.nn.utils.get_total_norm([p.grad for p in plain.parameters()]))
        Path(out).write_text(json.dumps({"before": before, "after": after, "ref_before": ref_before,
                                         "ref_after": ref_after, "local_share": shard}))


if __name__ == "__main__":
    main(sys.argv[1])
    release_distributed()  # as the platform's ranks end: FSDP's group and its threads gone
