"""The real `scalelab-train` process: --cfg job, and clear errors for bad overrides."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_cfg_job_prints_the_composed_config(train_cli) -> None:
    r = train_cli.run("--cfg", "job", "+experiment=shakespeare_char", "optim.lr=3e-4", timeout=180)
    assert r.returncode == 0, r.stderr
    for line in ("d_model: 128", "lr: 0.0003", "max_steps: 2000", "run_name: shakespeare_char"):
        assert line in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("override", "needle"), [
    ("model.d_modle=128", "d_modle"),          # typo: the structured schema rejects it
    ("optim.lr=fast", "optim.lr"),             # wrong type
    ("model.n_heads=3", "n_heads"),            # dataclass validation, before any IO
])
def test_bad_override_exits_nonzero_naming_the_key(tmp_path: Path, train_cli, override: str,
                                                   needle: str) -> None:
    r = train_cli.run(override, *train_cli.isolated(tmp_path, seed_store=False), timeout=180)
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "mlruns.db").exists()  # no MLflow run was created
