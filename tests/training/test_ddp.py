"""Two CPU processes (DDP, gloo): counters span all devices, val metrics are global."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_ddp_counts_all_devices(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("ddp_worker.py")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(worker)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "outlived the process group" not in proc.stderr  # gloo's threads joined before exit
    out = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("result_rank*.json"))]
    assert sorted(r["rank"] for r in out) == [0, 1]
    r0, r1 = sorted(out, key=lambda r: r["rank"])
    assert r0["world"] == 2
    # 6 steps x micro-batch 4 x 16 tokens x 2 devices, the same count on every rank
    assert r0["tokens_seen"] == r1["tokens_seen"] == 6 * 4 * 16 * 2
    assert r0["val"] == r1["val"] and r0["val"]["val/loss"] > 0  # reduced over ranks
    assert r0["sample"].startswith("ab") and r1["sample"] is None  # rank 0 samples
    p = r0["perf"]
    assert p["tokens_per_sec_per_device"] == pytest.approx(p["tokens_per_sec"] / 2)
    assert 0 < p["mfu"] < 1.0  # a fraction of the peak, never above it


def test_uses_gpu_reads_the_accelerator_and_asks_torch_only_for_auto() -> None:
    import torch

    from scalelab.training.devices import uses_gpu

    assert uses_gpu("gpu") and uses_gpu("cuda")
    assert not uses_gpu("cpu") and not uses_gpu("mps")
    assert uses_gpu("auto") == torch.cuda.is_available()
