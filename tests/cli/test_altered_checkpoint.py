"""A checkpoint whose stored model config no longer fits its tensors (edited, then re-signed) is
refused in one line by scalelab-sample and scalelab-export (both formats); nothing is exported."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scalelab.cli import export as export_cli
from scalelab.cli import sample as sample_cli
from scalelab.model import ModelConfig, Transformer
from scalelab.training.checkpoint import HPARAMS_KEY, RUN_KEY, write_checkpoint


@pytest.fixture()
def altered(tmp_path: Path) -> Path:
    cfg = ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, max_seq_len=16)
    weights = {f"model.{k}": v for k, v in Transformer(cfg).state_dict().items()}
    stored = {**cfg.to_dict(), "d_model": 64}  # the edit: the config says 64, the tensors 32
    path = tmp_path / "altered.ckpt"
    write_checkpoint({"state_dict": weights, "global_step": 1, HPARAMS_KEY: {"model_cfg": stored},
                      RUN_KEY: {"objective": "causal", "tokenizer": {"name": "byte"}}}, path)
    return path  # written with its size/hash sidecar: the file itself verifies


@pytest.mark.parametrize("tool", ["sample", "export", "export_hf"])
def test_an_altered_checkpoint_is_one_line(tool: str, altered: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exported"
    if tool == "sample":
        code = sample_cli.main([str(altered), "--max-new-tokens", "2"])
    else:
        fmt = ["--format", "hf"] if tool == "export_hf" else []
        code = export_cli.main([str(altered), "--out", str(out), *fmt])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and str(altered) in err, err
    assert "do not match the model config" in err and "d_model=64" in err, err
    assert not out.exists()
    torch.load(altered, weights_only=True)  # untouched
