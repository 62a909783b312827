"""The shell scripts under scripts/ parse (bash -n): the GPU ones run only on a lent GPU
machine, where a syntax error would cost the session's few minutes of device time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_script_parses(script: Path) -> None:
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_there_are_scripts_to_check() -> None:
    assert {"gpu_all.sh", "gpu_bundle.sh"} <= {p.name for p in SCRIPTS}
