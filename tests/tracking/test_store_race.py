"""Two processes that open a FRESH SQLite store at the same moment both succeed: creating and
migrating the schema is serialized by a file lock beside the database (tracking.store)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

# Each process imports everything, says it is ready, waits for "go", then opens the store the
# way a sweep does (its parent run): both hit the empty file together.
_OPEN = """
import sys, time
from pathlib import Path
from scalelab.tracking.sweep import SweepParent
tmp, n = Path(sys.argv[1]), sys.argv[2]
(tmp / f"ready{n}").touch()
while not (tmp / "go").exists():
    time.sleep(0.01)
parent = SweepParent.open(f"sqlite:///{tmp / 'mlruns.db'}", "race", f"race{n}",
                          str(tmp / "mlartifacts"))
print("opened", parent.run_id)
"""


@pytest.mark.slow
def test_two_processes_open_a_fresh_store_together(tmp_path: Path, train_cli) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN, str(tmp_path), str(n)],
                              env=train_cli.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in (1, 2)]
    try:
        while not all((tmp_path / f"ready{n}").exists() for n in (1, 2)):
            assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "opened" in out, out[-3000:]
        assert "Traceback" not in out
