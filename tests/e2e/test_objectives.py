"""Each objective trains through the CLI: masked-LM loss falls; seq2seq reverse is learned."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


def _summary(tmp: Path, name: str) -> dict:
    runs = list((tmp / "outputs").glob(f"*/*_{name},*"))  # <time>_<name>,<its overrides>
    assert len(runs) == 1, runs
    return json.loads((runs[0] / "summary.json").read_text())


@pytest.mark.slow
def test_mlm_loss_falls(tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    r = train_cli.run(
        "+experiment=bert_mlm_small", "data=shakespeare", "tokenizer=char",
        f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        "train.max_steps=200", "train.val_every=200", "train.val_batches=4", "optim.warmup_steps=15",
        "logger=none", *train_cli.isolated(tmp_path)[:2], "trainer.enable_progress_bar=false",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = _summary(tmp_path, "bert_mlm_small")
    # an untrained model sits at ln 69 ~ 4.23 (65 chars + 4 specials); 150 steps reach ~3.1
    assert s["final_val_loss"] < math.log(69) - 1.0, s


@pytest.mark.slow
def test_seq2seq_reverse_reaches_high_exact_match(tmp_path: Path, train_cli) -> None:
    r = train_cli.run(
        "+experiment=reverse_seq2seq", "data.max_len=6", "train.max_steps=500",
        "train.val_every=250", "train.val_batches=2",
        "logger=none", f"paths.log_dir={tmp_path / 'outputs'}", "trainer.enable_progress_bar=false",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = _summary(tmp_path, "reverse_seq2seq")
    assert s["metrics"]["final/exact_match"] >= 0.9, s
    # tokens are the padded target tokens trained on (<= 7 a row here), not 500 x 64 x block 32
    tokens = s["metrics"]["final/tokens_seen"]
    assert tokens % 64 == 0 and 500 * 64 * 2 <= tokens <= 500 * 64 * 7, tokens
    assert "ok" in s["sample"]
