"""`resume=true` continues THE SAME run: a command whose config differs is refused in one line
naming each key and both values; a longer run says what happens to its lr curve."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scalelab.cli.resume_compare import check_same_run, differences
from scalelab.config.compose import compose
from scalelab.config.spec import build_spec


def _tiny(shared_data_dir: Path) -> list[str]:
    return ["model=nano", "model.n_layers=1", "model.d_model=32", "model.n_heads=2",
            "model.max_seq_len=16", "data=shakespeare", "tokenizer=char",
            f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "train.global_batch_size=4",
            "train.val_batches=1", "callbacks.sample.enabled=false", "logger=none"]


def _stored(run: Path, overrides: list[str]) -> None:
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose("train", overrides), run / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(overrides), run / ".hydra" / "overrides.yaml")


def _requested(overrides: list[str]) -> tuple[dict, object]:
    cfg = compose("train", overrides)
    return OmegaConf.to_container(cfg, resolve=False), build_spec(cfg)


def test_what_a_resume_may_change(tmp_path: Path) -> None:
    base = ["train.max_steps=60", "train.val_every=10", "callbacks=[early_stopping]"]
    _stored(tmp_path, base)
    meta = {"lr_segments": [[0, 60]]}
    # logging, progress and checkpoint cadence cannot change the result
    same = [*base, "resume=true", "logger=none", "callbacks.checkpoint.every_n_steps=5",
            "trainer.log_every_n_steps=7", "+tags.note=x"]
    assert check_same_run(tmp_path, *_requested(same), meta) == [(0, 60)]
    # the README's literal command drops the run's overrides: each difference is named
    with pytest.raises(ValueError) as e:
        check_same_run(tmp_path, *_requested(["resume=true", "train.max_steps=60"]), meta)
    msg = str(e.value)
    assert "callbacks.early_stopping: {...} -> (absent)" in msg and "train.val_every: 10 -> 125" in msg
    assert "train.max_steps=60 train.val_every=10 callbacks=[early_stopping]" in msg
    assert "\n" not in msg
    # a longer run must say what the lr curve does
    longer = [*base, "train.max_steps=100"]
    with pytest.raises(ValueError, match=r"planned for 60 steps.*train\.resume_schedule=continue"):
        check_same_run(tmp_path, *_requested(longer), meta)
    assert check_same_run(tmp_path, *_requested([*longer, "train.resume_schedule=restart"]),
                          meta) == [(0, 60), (60, 40)]
    assert check_same_run(tmp_path, *_requested([*longer, "train.resume_schedule=continue"]),
                          meta) == [(0, 60)]


def test_differences_name_sections_once() -> None:
    assert differences({"a": {"b": 1, "c": {"d": 2}}}, {"a": {"b": 1}}) == [("a.c", {"d": 2}, "(absent)")]


def test_refused_then_restarted_for_real(tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    """Real runs: 6 steps with EarlyStopping; a resume without it is refused and changes
    nothing; a resume to 10 steps with train.resume_schedule=restart continues the run."""
    import torch

    run = tmp_path / "run"
    first = [*_tiny(shared_data_dir), "train.max_steps=6", "train.val_every=3",
             "callbacks=[early_stopping]", f"paths.output_dir={run}",
             f"paths.data_dir={train_cli.data_dir()}", f"paths.log_dir={tmp_path / 'outputs'}",
             "trainer.enable_progress_bar=false"]
    r = train_cli.run(*first)
    assert r.returncode == 0, r.stderr[-3000:]
    config = (run / ".hydra" / "config.yaml").read_text()

    r = train_cli.run(*_tiny(shared_data_dir), "train.max_steps=6", f"paths.output_dir={run}",
                      f"paths.data_dir={train_cli.data_dir()}", "resume=true")
    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()
    assert len(error) == 1 and "callbacks.early_stopping" in error[0], r.stderr[-3000:]
    assert "train.val_every: 3 -> 125" in error[0], error[0]
    assert (run / ".hydra" / "config.yaml").read_text() == config  # the run is untouched

    r = train_cli.run(*first, "train.max_steps=10", "train.resume_schedule=restart", "resume=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "restarted at step 6 by train.resume_schedule" in r.stdout + r.stderr
    meta = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert meta["global_step"] == 10
    assert meta["hyper_parameters"]["lr_segments"] == [[0, 6], [6, 4]]
