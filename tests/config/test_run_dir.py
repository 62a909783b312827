"""The run-folder resolver behind hydra.run.dir: new folders, collisions, resume targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.config.compose import normalize_overrides
from scalelab.config.run_dir import _RUN_DIRS, latest_run_dir, resolve_run_dir


@pytest.fixture(autouse=True)
def _fresh_cache():
    _RUN_DIRS.clear()
    yield
    _RUN_DIRS.clear()


def test_new_folder_and_collision_suffix(tmp_path: Path) -> None:
    d = resolve_run_dir(None, False, str(tmp_path), "exp", "2026-01-01", "10-00-00")
    assert d == str(tmp_path / "2026-01-01" / "10-00-00_exp")
    Path(d).mkdir(parents=True)
    assert resolve_run_dir(None, False, str(tmp_path), "exp", "2026-01-01", "10-00-00") == d  # cached
    _RUN_DIRS.clear()
    assert resolve_run_dir(None, False, str(tmp_path), "exp", "2026-01-01", "10-00-00").endswith("_exp_1")


def test_explicit_output_dir_and_checkpoint_folder(tmp_path: Path) -> None:
    assert resolve_run_dir(str(tmp_path / "x"), True, "/nowhere", "e", "d", "t") == str(tmp_path / "x")
    ck = tmp_path / "run" / "checkpoints" / "step.ckpt"
    assert resolve_run_dir(None, False, "/nowhere", "e", "d", "t", str(ck)) == str(tmp_path / "run")


def test_resume_picks_the_latest_run_with_that_name(tmp_path: Path) -> None:
    import os
    import time

    for i, name in enumerate(["09-00-00_exp", "10-00-00_exp", "11-00-00_other", "08-00-00_exp_1"]):
        ck = tmp_path / "2026-01-01" / name / "checkpoints" / "last.ckpt"
        ck.parent.mkdir(parents=True)
        ck.write_bytes(b"x")
        t = time.time() - 100 + i * 10
        os.utime(ck, (t, t))
    (tmp_path / "2026-01-01" / "12-00-00_exp").mkdir()  # no checkpoint: not resumable
    assert latest_run_dir(tmp_path, "exp") == tmp_path / "2026-01-01" / "08-00-00_exp_1"
    assert resolve_run_dir(None, True, str(tmp_path), "other", "d", "t").endswith("11-00-00_other")
    with pytest.raises(ValueError, match="no earlier run named 'nope'"):
        resolve_run_dir(None, True, str(tmp_path), "nope", "d", "t")


def test_plus_experiment_spelling_is_accepted() -> None:
    assert normalize_overrides(["+experiment=a", "+debug=overfit", "+tags.x=1", "model=nano"]) == [
        "experiment=a", "debug=overfit", "+tags.x=1", "model=nano"]
