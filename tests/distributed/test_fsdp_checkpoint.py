"""FSDP as far as a CPU allows: a truly sharded checkpoint (2 gloo ranks, one shard file each)
converts into one plain checkpoint that loads with weights_only=True, equals the original
weights exactly, and works with the sampling, export and HF export CLIs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.training.checkpoint import consolidate_checkpoint, is_sharded_checkpoint

from .helpers import REPO, env_for, eval_loss, model_config

pytestmark = pytest.mark.slow


def test_sharded_checkpoint_consolidates_to_a_plain_loadable_one(single_run: Path, tmp_path: Path):
    src = single_run / "checkpoints" / "last.ckpt"
    sharded = tmp_path / "last.ckpt"  # FSDP names the folder like the file it replaces
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(Path(__file__).with_name("shard_worker.py")), str(src), str(sharded)],
        cwd=REPO, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert is_sharded_checkpoint(sharded)
    assert sorted(f.name for f in sharded.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]

    # the CLI entry point, as a user runs it
    out = tmp_path / "last.full.ckpt"
    c = subprocess.run([sys.executable, "-m", "scalelab.cli.consolidate", str(sharded), "-o", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    full = torch.load(out, map_location="cpu", weights_only=True)
    orig = torch.load(src, map_location="cpu", weights_only=True)
    assert full["state_dict"].keys() == orig["state_dict"].keys()
    for k, v in orig["state_dict"].items():
        assert torch.equal(full["state_dict"][k], v), k
    assert full["global_step"] == orig["global_step"] and full["scalelab"] == orig["scalelab"]

    # same function in-process, default output name
    assert consolidate_checkpoint(sharded) == tmp_path / "last.ckpt.consolidated.ckpt"
    x = torch.randint(0, model_config(orig)["vocab_size"], (4, 17))
    assert eval_loss(out, x) == eval_loss(src, x)

    # the sampling and export CLIs read the consolidated file (both use weights_only=True)
    s = subprocess.run([sys.executable, "-m", "scalelab.cli.sample", str(out), "--max-new-tokens", "20"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert s.returncode == 0 and s.stdout.strip(), s.stderr[-3000:]
    e = subprocess.run([sys.executable, "-m", "scalelab.cli.export", str(out), "--out", str(tmp_path / "exp")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert e.returncode == 0 and any((tmp_path / "exp").iterdir()), e.stderr[-3000:]
    h = subprocess.run([sys.executable, "-m", "scalelab.cli.export", str(out), "--out",
                        str(tmp_path / "hf"), "--format", "hf"],
                       cwd=REPO, capture_output=True, text=True, timeout=180)
    assert h.returncode == 0 and (tmp_path / "hf" / "config.json").is_file(), h.stderr[-3000:]
