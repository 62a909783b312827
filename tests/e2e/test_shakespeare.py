"""End to end: the shakespeare_char shape trains through the real CLI and its loss falls.

Also: the run lands under the configured root whatever the working directory is, and the
checkpoint feeds `scalelab-sample` and `scalelab-export` (weights_only loads).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.slow
def test_shakespeare_char_trains_samples_and_exports(tmp_path: Path, shared_data_dir: Path,
                                                     train_cli) -> None:
    elsewhere = tmp_path / "some" / "other" / "cwd"
    elsewhere.mkdir(parents=True)
    r = train_cli.run(
        "+experiment=shakespeare_char",
        f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        "train.max_steps=300", "train.val_every=150", "train.val_batches=4",
        "optim.warmup_steps=20", "callbacks.sample.max_new_tokens=100",
        *train_cli.isolated(tmp_path),
        cwd=elsewhere, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert list(elsewhere.iterdir()) == []  # nothing written relative to the cwd
    runs = list((tmp_path / "outputs").glob("*/*_shakespeare_char,*"))  # <time>_<name>,<its overrides>
    assert len(runs) == 1, runs
    run = runs[0]
    summary = json.loads((run / "summary.json").read_text())
    # char vocab 65 + 4 specials: an untrained model sits at ln(69) ~ 4.2
    assert summary["final_val_loss"] < 3.0, summary
    assert summary["final_val_loss"] < math.log(65) - 1.0
    assert summary["metrics"]["final/steps"] == 300
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "sample.txt").read_text().strip()
    for line in ("MLflow run", "output folder", "final val loss", "tokens/s", "sample:"):
        assert line in r.stdout, r.stdout[-2000:]

    s = subprocess.run([sys.executable, "-m", "scalelab.cli.sample", str(run), "--prompt", "ROMEO:",
                        "--max-new-tokens", "40"], capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith("ROMEO:") and len(s.stdout) > 30

    out = tmp_path / "exported"
    e = subprocess.run([sys.executable, "-m", "scalelab.cli.export", str(run), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stderr
    from scalelab.model import ModelConfig, Transformer

    info = json.loads((out / "config.json").read_text())
    model = Transformer(ModelConfig.from_dict(info["model_config"]))
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    assert info["tokenizer"]["name"] == "char" and info["n_params"] == sum(
        p.numel() for p in model.parameters())
