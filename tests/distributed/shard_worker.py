"""Run under torchrun (2 CPU processes, gloo): write a plain checkpoint's weights as a *sharded*
checkpoint, exactly in the layout Lightning's FSDPStrategy(state_dict_type="sharded") writes.

    python -m torch.distributed.run --standalone --nproc_per_node=2 shard_worker.py SRC.ckpt OUT_DIR

Each rank shards the Transformer with FSDP2 (``fully_shard`` per transformer block, then the
root; FSDP runs on CPU/gloo here, unlike Lightning's FSDPStrategy), so every rank holds only its
slice of each parameter as a DTensor. ``torch.distributed.checkpoint`` then writes one shard
file per rank plus ``.metadata``, under the key ``model`` (Lightning's converted_state), and rank
0 writes the non-tensor rest to ``meta.pt`` — the same two calls FSDPStrategy.save_checkpoint makes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lightning_fabric.strategies.fsdp import _METADATA_FILENAME, _distributed_checkpoint_save
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from scalelab.model import ModelConfig, Transformer
from scalelab.training.checkpoint import model_config
from scalelab.training.distributed import block_classes, release_distributed


def main(src: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ck = torch.load(src, map_location="cpu", weights_only=True)
    model = Transformer(ModelConfig.from_dict(model_config(ck)))
    key = next(k for k in ck["state_dict"] if k.endswith("tok_emb.weight"))
    prefix = key[: -len("tok_emb.weight")]
    model.load_state_dict({k[len(prefix):]: v for k, v in ck["state_dict"].items()})
    for m in model.modules():
        if isinstance(m, tuple(block_classes())):
            fully_shard(m)
    fully_shard(model)
    sd = model.state_dict()
    w = sd["tok_emb.weight"]
    assert isinstance(w, DTensor) and w.to_local().shape[0] < w.shape[0], "not sharded"
    print(f"rank {rank}/{world}: tok_emb local {tuple(w.to_local().shape)} of {tuple(w.shape)}",
          flush=True)
    _distributed_checkpoint_save({"model": {prefix + k: v for k, v in sd.items()}}, Path(out))
    if rank == 0:
        rest = {k: v for k, v in ck.items() if k not in ("state_dict", "optimizer_states")}
        torch.save(rest, Path(out) / _METADATA_FILENAME)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    release_distributed()
    # Something fully_shard leaves behind keeps the group (and gloo's threads) alive past
    # destroy here (its DTensor specs and meshes stay alive; the holder was not found), and a
    # gloo thread freeing a tensor during the interpreter's exit aborts the rank (-6): the work
    # is on disk, so leave without the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
