"""Every command block the README marks `<!-- runnable -->` runs as written, in quick mode.

Quick mode: `make` targets run through the Makefile itself (`make -n` prints the recipe with the
install step assumed done, so nothing is reinstalled), with tiny overrides appended to `ARGS`
(training) and `--plan-only` for sweeps (tests/e2e/test_sweep.py runs the full cpu_tiny sweep);
`scalelab-*` lines get the same tiny overrides. Everything writes into a scratch SCALELAB_ROOT.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
QUICK_TRAIN = ("model.n_layers=1 model.d_model=32 model.n_heads=2 train.max_steps=3 "
               "train.val_every=3 train.val_batches=1 train.global_batch_size=4 "
               "callbacks.sample.enabled=false logger.log_checkpoint=false")
SKIP_TARGETS = {"install", "test", "test-all", "lint", "format"}  # the environment / this suite


def runnable_commands(readme: str) -> list[str]:
    """Command lines of the ```bash blocks right after a `<!-- runnable -->` line."""
    blocks = re.findall(r"<!-- runnable -->\s*\n```bash\n(.*?)```", readme, flags=re.S)
    out = []
    for block in blocks:
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def quick(cmd: str) -> list[str] | None:
    """The shell command to run for one README line (None: nothing to run here)."""
    words = shlex.split(cmd)
    if words[0] == "make":
        target = words[1] if len(words) > 1 else "help"
        if target in SKIP_TARGETS:
            return None
        args = next((w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")), "")
        extra = {"train": QUICK_TRAIN, "sweep": "--plan-only", "ui": "--dry-run"}.get(target, "")
        recipe = subprocess.run(
            ["make", "-s", "-n", "-o", f"{VENV}/.installed", target, f"VENV={VENV}",
             f"ARGS={args} {extra}".strip()],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        return ["bash", "-c", recipe]
    if words[0].startswith("scalelab-"):
        return [str(VENV / "bin" / words[0]), *words[1:], *shlex.split(QUICK_TRAIN)] \
            if words[0] == "scalelab-train" else [str(VENV / "bin" / words[0]), *words[1:]]
    return ["bash", "-c", cmd]


def test_readme_has_runnable_blocks() -> None:
    cmds = runnable_commands((REPO / "README.md").read_text())
    assert any(c.startswith("make train") for c in cmds) and any("sweep" in c for c in cmds), cmds


@pytest.mark.slow
@pytest.mark.parametrize("cmd", runnable_commands((REPO / "README.md").read_text()))
def test_readme_command_runs(cmd: str, tmp_path: Path) -> None:
    argv = quick(cmd)
    if argv is None:
        pytest.skip(f"{cmd!r}: sets up the environment this suite runs in")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(SCALELAB_ROOT=str(tmp_path), TQDM_DISABLE="1")
    # the token cache is shared (prepared once) instead of re-tokenized in every scratch root
    if argv[0].endswith("scalelab-train") or "scalelab-train" in argv[-1]:
        suffix = f" paths.data_dir={REPO / 'data_cache'}"
        argv = [*argv[:-1], argv[-1] + suffix] if argv[0] == "bash" else [*argv, suffix.strip()]
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{cmd}\n{argv}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
