"""torchmetrics without the optional packages it pulls in: Lightning still imports and works,
the packages themselves stay importable, and scalelab-train keeps the full import where user
code may need it. Each case runs in a fresh interpreter: an import happens once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("scipy.signal", "transformers", "matplotlib.pyplot")

PROBE = """
import json, sys
from scalelab import lean_imports
installed = lean_imports.install() if sys.argv[1] == "lean" else False
import pytorch_lightning, torch, torchmetrics
from torchmetrics.utilities import imports as flags
loaded = {m: m in sys.modules for m in HEAVY}
mean = torchmetrics.MeanMetric()
mean.update(torch.tensor([1.0, 2.0, 6.0]))
out = dict(installed=installed, loaded=loaded, mean=float(mean.compute()),
           finder_left=lean_imports._finder() is not None, lean=lean_imports.torchmetrics_is_lean(),
           transformers_flag=bool(flags._TRANSFORMERS_GREATER_EQUAL_4_4),
           message=str(flags._MATPLOTLIB_AVAILABLE),
           install_again=lean_imports.install())
import scipy.signal, matplotlib  # the real packages are untouched
from lightning_utilities.core.imports import package_available
out["scipy_available"] = package_available("scipy") and hasattr(scipy.signal, "welch")
print(json.dumps(out))
""".replace("HEAVY", repr(HEAVY))


def _probe(mode: str, **env: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                       timeout=300, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_lightning_loads_torchmetrics_without_scipy_transformers_or_matplotlib() -> None:
    full = _probe("full")  # the control: these packages are installed and would be imported
    assert full["loaded"] == dict.fromkeys(HEAVY, True) and not full["lean"]
    lean = _probe("lean")
    assert lean["installed"] and lean["loaded"] == dict.fromkeys(HEAVY, False)
    assert lean["mean"] == full["mean"] == 3.0  # torchmetrics itself works as before
    assert lean["lean"] and not lean["transformers_flag"] and full["transformers_flag"]
    assert "SCALELAB_FULL_TORCHMETRICS=1" in lean["message"]  # what a user of Metric.plot reads
    assert not lean["finder_left"] and not lean["install_again"]  # one import, then gone
    assert lean["scipy_available"] and full["scipy_available"]


def test_the_environment_asks_for_the_full_import() -> None:
    out = _probe("lean", SCALELAB_FULL_TORCHMETRICS="1")
    assert not out["installed"] and out["loaded"] == dict.fromkeys(HEAVY, True)
    assert not out["lean"] and out["transformers_flag"]


def _imported(stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` lines (``import time: self | cum | name``)."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


TINY = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "train.global_batch_size=4", "train.val_batches=1", "callbacks.sample.enabled=false",
        "logger.log_checkpoint=false", "data.max_bytes=200000", "train.max_steps=2")


@pytest.mark.slow
def test_scalelab_train_is_lean_unless_a_callback_outside_lightning_is_configured(
        tmp_path: Path, train_cli) -> None:
    tests_dir = Path(__file__).resolve().parent  # `cli.raise_at_step` for the child process
    path = os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")])
    user_callback = "+callbacks.mine={_target_: cli.raise_at_step.RaiseAtStep, step: 1000}"

    def heavy_imported(name: str, *overrides: str, **env: str) -> set[str]:
        (tmp_path / name).mkdir()
        r = train_cli.run(*TINY, *train_cli.isolated(tmp_path / name), *overrides,
                          env=train_cli.env(PYTHONPROFILEIMPORTTIME="1", PYTHONPATH=path, **env))
        assert r.returncode == 0, r.stderr[-3000:]
        mods = _imported(r.stderr)
        assert "torchmetrics.functional" in mods  # Lightning did import torchmetrics
        return mods & set(HEAVY)

    assert heavy_imported("lightning_callbacks", "callbacks=lr_monitor") == set()
    # user code may use BERTScore or Metric.plot: the full import, unless the variable says no
    assert heavy_imported("user_callback", user_callback) == set(HEAVY)
    assert heavy_imported("user_callback_lean", user_callback, SCALELAB_FULL_TORCHMETRICS="0") == set()
