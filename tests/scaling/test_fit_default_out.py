"""scalelab-fit without --out writes to <project root>/reports/, whatever the working directory."""

import os
import subprocess
import sys

import pytest
from tests.scaling.synthetic import isoflop_runs

pytestmark = pytest.mark.slow


def test_default_report_folder_does_not_depend_on_the_cwd(tmp_path):
    runs = isoflop_runs(budgets=(1e17, 1e18, 1e19), sizes_per_budget=5, noise=0.003, seed=0)
    runs.to_csv(tmp_path / "runs.csv", index=False)
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    p = subprocess.run([sys.executable, "-m", "scalelab.cli.fit", "--csv", str(tmp_path / "runs.csv"),
                        "--n-boot", "0", "--grid", "coarse", "--approaches", "2,3", "--no-extrapolate"],
                       cwd=elsewhere, env={**os.environ, "SCALELAB_ROOT": str(root)},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (root / "reports" / "fit_runs" / "report.md").is_file()
    assert not any(elsewhere.iterdir())
