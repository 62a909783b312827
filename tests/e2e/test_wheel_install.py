"""`pip install .` (a real wheel, not editable) runs from any folder and writes results there.

The wheel is built from a copy of the source (no build/ or egg-info left in the repo) and
installed with --no-deps into a fresh venv; the venv reaches the already-installed
dependencies through a .pth file naming this interpreter's site-packages, so nothing is
downloaded. PYTHONPATH is cleared so the installed package, not the checkout, is what runs.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.max_steps=3",
        "train.val_every=3", "train.val_batches=1", "train.global_batch_size=4",
        "callbacks.sample.enabled=false", "logger.log_checkpoint=false",
        "trainer.enable_progress_bar=false"]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)


@pytest.mark.slow
def test_wheel_installs_and_trains_from_another_folder(tmp_path: Path) -> None:
    src = tmp_path / "src_copy"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
              "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)])
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("scalelab-*.whl")

    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert r.returncode == 0, r.stderr
    vpy = venv / "bin" / "python"
    purelib = _run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # the dependencies, already installed here (a plain path entry: its .pth files, such as an
    # editable scalelab's, are not processed)
    Path(purelib, "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    r = _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps",
              "--no-index", "-q", str(wheel)])
    assert r.returncode == 0, r.stderr[-3000:]

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SCALELAB_ROOT") and not k.startswith("MLFLOW_")}
    work = tmp_path / "work"
    myconf = tmp_path / "myconf" / "model"  # a user's own config folder adds a model preset
    myconf.mkdir(parents=True)
    (myconf / "mine.yaml").write_text("defaults:\n  - nano\n  - _self_\nmax_seq_len: 32\n")
    work.mkdir()

    r = _run([str(vpy), "-c", "import scalelab, sys; print(scalelab.__file__)"], cwd=work, env=env)
    assert str(venv) in r.stdout, r.stdout + r.stderr  # the wheel, not the checkout

    r = _run([str(venv / "bin" / "scalelab-train"), "--cfg", "job", "+experiment=shakespeare_char"],
             cwd=work, env=env)
    assert r.returncode == 0 and "run_name: shakespeare_char" in r.stdout, r.stderr[-3000:]

    r = _run([str(venv / "bin" / "scalelab-train"), *TINY, "model=mine",
              f"hydra.searchpath=[file://{myconf.parent}]", f"paths.data_dir={REPO / 'data_cache'}"],
             cwd=work, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summaries = list((work / "outputs").glob("*/*/summary.json"))
    assert len(summaries) == 1, list(work.rglob("*"))[:50]
    assert (work / "mlruns.db").is_file()  # results in the working directory
    assert "max_seq_len: 32" in (summaries[0].parent / ".hydra" / "config.yaml").read_text()
    site_pkg = Path(purelib) / "scalelab"
    assert not (site_pkg / "outputs").exists() and not (Path(purelib) / "outputs").exists()
