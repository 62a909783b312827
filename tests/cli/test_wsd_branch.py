"""train.save_at_steps + train.init_from: a WSD cooldown branch is a NEW run continuing from step N."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tests.conftest import sqlite_store


@pytest.mark.slow
def test_step_checkpoint_then_branch_is_a_new_run_from_that_step(tmp_path: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "mlruns.db")
    common = [
        "model=gpt2_tiny", "data=pystdlib", "data.max_bytes=300000", "tokenizer=byte",
        "model.max_seq_len=32", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
        "train.global_batch_size=8", "train.val_batches=1", "train.num_threads=1",
        "optim=wsd", "optim.decay_fraction=0.25", "optim.warmup_steps=2",
        "trainer.log_every_n_steps=1", "callbacks.sample.enabled=false",
        "logger.log_checkpoint=false", "logger.experiment_name=wsd_branch",
        *train_cli.isolated(tmp_path, tracking_uri=uri),
    ]
    main_dir, branch_dir = tmp_path / "main", tmp_path / "branch"
    r = train_cli.run(*common, "train.max_steps=16", "train.val_every=8", "run_name=main",
                      "train.save_at_steps=[6]", f"paths.output_dir={main_dir}", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ckpt = main_dir / "checkpoints" / "step_6.ckpt"
    assert ckpt.is_file()
    import torch

    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 6

    # a branch of 8 steps with decay fraction 0.25 decays over its last 2 steps: it starts at 6
    r = train_cli.run(*common, "train.max_steps=8", "train.val_every=4", "run_name=branch",
                      f"train.init_from={ckpt}", f"paths.output_dir={branch_dir}", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    main = json.loads((main_dir / "summary.json").read_text())
    branch = json.loads((branch_dir / "summary.json").read_text())
    assert branch["run_id"] != main["run_id"]  # a NEW MLflow run
    assert branch["metrics"]["final/steps"] == 8
    assert branch["metrics"]["final/tokens_seen"] == 8 * 8 * 32  # includes the inherited prefix
    assert math.isfinite(branch["final_val_loss"])
    client = MlflowClient(uri)
    steps = sorted(m.step for m in client.get_metric_history(branch["run_id"], "train/loss"))
    assert steps[0] > 6 - 1 and steps[-1] <= 8  # logging continues from step 6, not from 0
    lrs = {m.step: m.value for m in client.get_metric_history(branch["run_id"], "lr")}
    main_lrs = {m.step: m.value for m in client.get_metric_history(main["run_id"], "lr")}
    peak, floor = 1e-3, 1e-4  # optim.lr and min_lr_ratio=0.1 of conf/optim/wsd.yaml
    # the branch starts at the main run's stable lr, at the main's step 6 ...
    assert sorted(lrs) == [6, 7] and lrs[6] == pytest.approx(main_lrs[6]) == pytest.approx(peak)
    # ... and cools down to the floor over its last 2 steps, where the main was still stable
    assert lrs[7] == pytest.approx(floor) and main_lrs[7] == pytest.approx(peak)
    assert main_lrs[12] == pytest.approx(peak) and main_lrs[15] == pytest.approx(floor)
    assert client.get_run(main["run_id"]).info.status == "FINISHED"  # untouched by the branch


@pytest.mark.slow
def test_save_at_steps_beyond_the_run_fails_naming_the_key(tmp_path: Path, train_cli) -> None:
    r = train_cli.run("model=gpt2_tiny", "train.max_steps=5", "train.save_at_steps=[9]",
                      *train_cli.isolated(tmp_path), timeout=180)
    assert r.returncode != 0
    assert "train.save_at_steps" in r.stderr, r.stderr[-2000:]
