"""Hydra's own config copies in a run folder (.hydra/config.yaml, hydra.yaml, overrides.yaml)
never keep a typed URI password, and `resume=true` still continues the run from them."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from scalelab.cli.resume_compare import check_same_run
from scalelab.config.compose import compose
from scalelab.config.spec import build_spec
from scalelab.tracking.redact import redact

TINY = ["model=gpt2_tiny", "data=pystdlib", "data.max_bytes=100000", "tokenizer=byte",
        "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32",
        "callbacks.sample.enabled=false"]
SECRET = "+tags.db=postgresql://bob:hunter2@db.example/runs"


def test_the_run_folders_config_copies_are_redacted_and_resume_still_works(
        tmp_path: Path, train_cli) -> None:
    run = tmp_path / "run"
    args = [*TINY, *train_cli.isolated(tmp_path), SECRET, f"paths.output_dir={run}"]
    first = train_cli.run(*args, "train.max_steps=1")
    assert first.returncode == 0, first.stderr[-3000:]
    copies = sorted((run / ".hydra").glob("*.yaml"))
    assert [p.name for p in copies] == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    for p in copies:
        text = p.read_text()
        assert "hunter2" not in text and "bob:***@db.example" in text, p
    assert not [p for p in run.rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]
    # what resume=true reads from the folder: the stored copy still matches the command that
    # typed the password (the checkpoint and run id it also reads hold no config text)
    cfg = compose("train", [*args, "train.max_steps=1", "resume=true"])
    requested = OmegaConf.to_container(cfg, resolve=False)
    assert check_same_run(run, requested, build_spec(cfg), {"lr_segments": [[0, 1]]}) == [(0, 1)]


def test_a_redacted_copy_still_matches_the_command_that_typed_the_password(tmp_path: Path) -> None:
    overrides = ["model=nano", "data=shakespeare", "tokenizer=char", "logger=none",
                 "data.path=https://bob:hunter2@files.example/corpus.txt", "train.max_steps=5"]
    (tmp_path / ".hydra").mkdir()  # what Hydra saved, then redacted (cli/hydra_copies.py)
    (tmp_path / ".hydra" / "config.yaml").write_text(redact(OmegaConf.to_yaml(compose("train", overrides))))
    cfg = compose("train", overrides)
    requested = OmegaConf.to_container(cfg, resolve=False)
    assert check_same_run(tmp_path, requested, build_spec(cfg), {"lr_segments": [[0, 5]]}) == [(0, 5)]
