"""write_report writes real PNGs and a Markdown report with the required sections."""

import pandas as pd
import pytest

from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
from scalelab.scaling.fit_synthetic import isoflop_runs, loss_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results():
    good = isoflop_runs(budgets=(1e17, 1e18, 1e19, 1e20), sizes_per_budget=6, noise=0.003, seed=0)
    edge = isoflop_runs(budgets=(1e21,), sizes_per_budget=6, span=0.5, center_shift=1.2, seed=1)
    runs = pd.concat([good, edge], ignore_index=True)
    return fit_scaling_laws(runs, loss_curves(runs, points_per_run=15),
                            FitOptions(grid="coarse", n_boot=6, boot_grid="none"))


def test_report_files_and_sections(results, tmp_path):
    plan = pd.DataFrame({"budget": [1e17, 1e18], "N": [1e7, 3e7], "D": [1.7e9, 5.6e9]})
    files = write_report(results, tmp_path / "rep", plan=plan)
    names = sorted(p.name for p in files)
    assert names == ["frontier.png", "isoflop.png", "loss_vs_tokens.png", "parametric.png",
                     "report.html", "report.md"]
    for p in files:
        assert p.is_file() and p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC
            assert p.stat().st_size > 10_000  # a real figure, not an empty canvas
    md = (tmp_path / "rep" / "report.md").read_text()
    for needle in ("## Plan", "### Runs", "### Fitted parameters", "approach3.alpha", "tokens_per_param",
                   "Chinchilla (Hoffmann et al. 2022)", "Epoch AI replication", "406.4", "2085",
                   "### Extrapolation check", "Flagged and excluded", "C=1e+21", "![IsoFLOP profiles](isoflop.png)",
                   "One FLOPs convention throughout", "### Points each approach used", "### Noise"):
        assert needle in md, needle


def test_report_variants(tmp_path):
    runs = pd.concat([isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5, seed=s, variant=v)
                      for s, v in ((0, "pre"), (1, "post"))], ignore_index=True)
    res = fit_scaling_laws(runs, options=FitOptions(approaches=(2, 3), grid="small", n_boot=4,
                                                    boot_grid="none", extrapolate=False))
    files = write_report(res, tmp_path)
    names = {p.name for p in files}
    assert {"isoflop_pre.png", "isoflop_post.png", "parametric_post.png", "report.md"} <= names
    md = (tmp_path / "report.md").read_text()
    assert "## Variant comparison" in md and "## Variant `post`" in md and "loss_ratio" in md
