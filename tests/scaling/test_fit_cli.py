"""scalelab-fit through a real subprocess: CSV in, table + report out; bad CSVs exit 2."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.scaling.synthetic import isoflop_runs, loss_curves, with_endpoints

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _cli() -> list[str]:
    script = REPO / ".venv" / "bin" / "scalelab-fit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "scalelab.cli.fit"]


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*_cli(), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_csv_fit_writes_report(tmp_path):
    runs = with_endpoints(isoflop_runs(budgets=(1e17, 1e18, 1e19, 1e20), sizes_per_budget=6,
                                       noise=0.003, seed=0), fractions=(0.5,))
    runs.to_csv(tmp_path / "runs.csv", index=False)
    loss_curves(runs, points_per_run=15).to_csv(tmp_path / "curves.csv", index=False)
    out = tmp_path / "report"
    p = _run("--csv", tmp_path / "runs.csv", "--curves", tmp_path / "curves.csv", "--out", out,
             "--n-boot", 3, "--grid", "coarse")
    assert p.returncode == 0, p.stderr
    for needle in ("approach3.alpha", "approach2.a", "approach1.a", "95% CI", "extrapolation to C=1e+20"):
        assert needle in p.stdout, needle
    assert re.search(r"error [+-]\d+\.\d+% \[[+-]\d+\.\d+%, [+-]\d+\.\d+%\]", p.stdout)  # its interval
    assert {f.name for f in out.iterdir()} >= {"report.md", "report.html", "isoflop.png",
                                               "frontier.png", "parametric.png"}
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table>" in html  # renders in MLflow's viewer
    md = (out / "report.md").read_text()
    assert "end points of" in md  # the report says which points Approach 1 used


def test_fit_what_can_be_fitted(tmp_path):
    """Intermediate curve points never feed Approach 1, and one budget cannot give Approach 2:
    both are named with the reason, Approach 3 is fitted, exit 0."""
    runs = isoflop_runs(budgets=(1e17,), sizes_per_budget=7, noise=0.003, seed=0)
    runs.to_csv(tmp_path / "runs.csv", index=False)
    loss_curves(runs, points_per_run=10).to_csv(tmp_path / "curves.csv", index=False)
    p = _run("--csv", tmp_path / "runs.csv", "--curves", tmp_path / "curves.csv", "--n-boot", 0,
             "--grid", "coarse", "--no-report")
    assert p.returncode == 0, p.stderr
    out = " ".join(p.stdout.split())
    assert "Approach 2 left out" in out and "Approach 2 needs >= 2 usable" in out
    assert "Approach 1 left out" in out and "end points" in out
    assert "approach3.alpha" in out


def test_python_dash_m_works(tmp_path):
    p = subprocess.run([sys.executable, "-m", "scalelab.cli.fit", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--n-convention" in p.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("N,D\n1e6,1e8\n", "missing column 'loss'"),
        ("N,D,loss\n1e6,1e8,3.0\n2e6,-1,2.9\n", "column 'D'"),
        ("N,D,loss\n1e6,1e8,3.0\n2e6,1e8,2.9\n4e6,1e8,2.8\n", "Approach 3 needs >= 5"),
        ("N,D,loss,budget\n1e6,1e8,3.0,1e15\n2e6,5e7,2.9,1e15\n3e6,3e7,2.95,1e15\n"
         "1e6,1e9,2.8,1e16\n", "Approach 2 needs >= 2 usable"),
    ],
)
def test_bad_csv_exit_2(tmp_path, content, needle):
    csv = tmp_path / "bad.csv"
    csv.write_text(content)
    p = _run("--csv", csv, "--n-boot", 0, "--grid", "coarse", "--approaches", "2,3", "--no-report")
    assert p.returncode == 2
    assert needle in p.stderr and "bad.csv" in p.stderr, p.stderr


def test_missing_file_exit_2(tmp_path):
    p = _run("--csv", tmp_path / "nope.csv")
    assert p.returncode == 2 and "nope.csv" in p.stderr
