"""Multi-file outputs appear whole or not at all (scalelab.data.files.atomic_folder, used by the
plain and Hugging Face exports and the scaling report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.cli import export as export_cli
from scalelab.model import ModelConfig, Transformer
from scalelab.training.checkpoint import HPARAMS_KEY, RUN_KEY, write_checkpoint


def _checkpoint(path: Path, d_model: int) -> Path:
    cfg = ModelConfig(vocab_size=256, d_model=d_model, n_layers=1, n_heads=2, max_seq_len=16)
    weights = {f"model.{k}": v for k, v in Transformer(cfg).state_dict().items()}
    write_checkpoint({"state_dict": weights, "global_step": 1, HPARAMS_KEY: {"model_cfg": cfg.to_dict()},
                      RUN_KEY: {"objective": "causal", "tokenizer": {"name": "byte"}}}, path)
    return path


def _width(out: Path) -> tuple[int, int]:
    """(d_model in config.json, width of the embedding in model.pt)."""
    cfg = json.loads((out / "config.json").read_text())["model_config"]["d_model"]
    sd = torch.load(out / "model.pt", weights_only=True)
    return cfg, next(v for k, v in sd.items() if k.endswith("weight")).shape[-1]


# the writer every exporter uses, killed (SIGKILL, no cleanup) after one of its two files
_KILLED_MID_EXPORT = """
import os, signal, sys
from pathlib import Path
from scalelab.data.files import atomic_folder
with atomic_folder(Path(sys.argv[1]), may_replace={"model.pt", "config.json"}.__contains__) as tmp:
    (tmp / "model.pt").write_bytes(b"new weights")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_plain_export_is_replaced_whole_and_a_killed_one_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "exported"
    assert export_cli.main([str(_checkpoint(tmp_path / "a.ckpt", 32)), "--out", str(out)]) == 0
    assert _width(out) == (32, 32)
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_EXPORT, str(out)], timeout=120)
    assert killed.returncode == -9
    assert _width(out) == (32, 32)  # the old pair, whole: never a new model.pt beside it
    assert export_cli.main([str(_checkpoint(tmp_path / "b.ckpt", 64)), "--out", str(out)]) == 0
    assert _width(out) == (64, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "a.ckpt.sha256", "b.ckpt",
                                                          "b.ckpt.sha256", "exported"]


def test_export_never_replaces_a_folder_holding_other_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code = export_cli.main([str(_checkpoint(tmp_path / "a.ckpt", 32)), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "notes.txt" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_failed_block_leaves_no_temp_folder(tmp_path: Path) -> None:
    from scalelab.data.files import atomic_folder

    with pytest.raises(RuntimeError), atomic_folder(tmp_path / "r") as tmp:
        (tmp / "report.md").write_text("half")
        raise RuntimeError("plot failed")
    assert list(tmp_path.iterdir()) == []
