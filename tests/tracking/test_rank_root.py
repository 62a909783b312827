"""Rank detection (who may talk to MLflow) and the project root (never the cwd)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import scalelab
from scalelab.paths import conf_dir, repo_root
from scalelab.tracking import global_rank, is_global_zero

RANK_VARS = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "LOCAL_WORLD_SIZE",
             "JSM_NAMESPACE_RANK", "GROUP_RANK")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for v in RANK_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_single_process_is_global_zero(clean_env: pytest.MonkeyPatch) -> None:
    assert global_rank() == 0 and is_global_zero()


@pytest.mark.parametrize("env", [
    {"RANK": "1"},
    {"LOCAL_RANK": "1"},  # Lightning's subprocess launcher children
    {"NODE_RANK": "1", "LOCAL_RANK": "0"},
    {"SLURM_PROCID": "3", "SLURM_NTASKS": "4"},
])
def test_other_ranks_are_not_global_zero(clean_env: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert not is_global_zero()


def test_slurm_single_task_is_rank_zero(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "1")
    assert is_global_zero()


def test_root_comes_from_the_package_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCALELAB_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    root = repo_root()
    assert root == Path(scalelab.__file__).resolve().parents[2]
    assert (root / "pyproject.toml").is_file() and conf_dir() == root / "src" / "scalelab" / "conf"
    assert os.getcwd() == str(tmp_path)


def test_experiments_ship_inside_the_package() -> None:
    folder = conf_dir() / "experiment"
    assert folder == Path(scalelab.__file__).resolve().parent / "conf" / "experiment"
    assert not folder.is_symlink() and (folder / "shakespeare_char.yaml").is_file()
