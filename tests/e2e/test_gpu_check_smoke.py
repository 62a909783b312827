"""`make gpu-check`'s commands, run here with trainer=cpu (--cpu-smoke): a GPU session has
minutes, so the script must not break on something a CPU can find first (an import that moved
did, on an H200)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not DATA.is_file(), reason=f"{DATA} not found")
def test_gpu_check_cpu_smoke_passes_every_step(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "scripts/gpu_check.py", "--cpu-smoke", "--steps", "4",
                        "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    passed = [line for line in p.stdout.splitlines() if line.startswith("[PASS]")]
    assert len(passed) == 5 and "ALL PASS" in p.stdout, p.stdout[-3000:]
