"""LMModule under FSDP, two faults first seen on an H200 (make gpu-check):

- Lightning's FSDPPrecision refuses norm clipping, so LMModule clips through the FSDP root,
  whose norm covers every rank's shard (two gloo ranks, FULL_SHARD, each holding half);
- the end-of-run sample ran the sharded weights outside FSDP's forward (a dtype error after a
  finished run): with sharded weights there is no final sample, as there is none in training."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
from pytorch_lightning.strategies import FSDPStrategy

from scalelab.cli.lightning_module import final_sample
from scalelab.config.compose import compose
from scalelab.config.spec import build_spec
from scalelab.model import ModelConfig
from scalelab.training import CausalLM, OptimConfig

from .helpers import REPO, env_for

pytestmark = pytest.mark.slow


def test_clipping_under_fsdp_uses_the_norm_over_every_shard(tmp_path: Path) -> None:
    out = tmp_path / "clip.json"
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(Path(__file__).with_name("clip_worker.py")), str(out)],
        cwd=REPO, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "outlived the process group" not in p.stderr  # gloo's threads joined before exit
    r = json.loads(out.read_text())
    assert r["local_share"] == pytest.approx(0.5, abs=0.01)  # truly sharded
    assert r["before"] == pytest.approx(r["ref_before"], rel=1e-4) and r["before"] > 1.0
    # clipped to the limit over both shards, as torch clips the unsharded model
    assert r["after"] == pytest.approx(0.05, rel=1e-4)
    assert r["after"] == pytest.approx(r["ref_after"], rel=1e-4)


class Tok:
    def encode(self, s: str) -> list[int]:
        return [ord(c) % 32 for c in s]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def test_no_final_sample_from_sharded_weights(caplog: pytest.LogCaptureFixture) -> None:
    spec = build_spec(compose("train", ["model=nano", "tokenizer=char"]))
    assert spec.callbacks.sample.enabled and spec.objective == "causal"
    cfg = ModelConfig(vocab_size=32, max_seq_len=16, d_model=32, n_layers=1, n_heads=4)
    lm = CausalLM(cfg, OptimConfig(lr=1e-3), total_steps=4, tokenizer=Tok(), sample_tokens=8)
    lm._trainer = SimpleNamespace(strategy=pl.strategies.SingleDeviceStrategy("cpu"))
    assert final_sample(spec, lm, data=None) != ""  # unsharded: a sample, as before
    lm._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with caplog.at_level(logging.INFO, logger="scalelab.train"):
        assert final_sample(spec, lm, data=None) == ""
    assert "sample from the consolidated checkpoint with scalelab-sample" in caplog.text
