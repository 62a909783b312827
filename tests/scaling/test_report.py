"""write_report writes real PNGs and a Markdown report with the required sections."""

import pandas as pd
import pytest
from tests.scaling.synthetic import isoflop_runs, loss_curves

from scalelab.scaling import FitOptions, fit_scaling_laws, write_report

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
                   "One FLOPs convention throughout", "### Points each approach used", "### Noise",
                   "Without a form in N and D: the power law L_opt",
                   "bootstrap replicates, each refitting both the prediction and the held-out minimum",
                   "**Does L_opt follow one power law?**"):
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


def test_report_states_the_tuned_laws_with_their_plots(results, tmp_path):
    import numpy as np

    from scalelab.scaling.stage import TuneResult
    from scalelab.scaling.tune import VariantTune
    from scalelab.scaling.tune_fit import choose_beta2, fit_lr_law, fit_power_law
    from scalelab.scaling.tune_plot import plot_hparams, plot_tune

    rows = []
    for n in (1e3, 1e4):  # parabolas in log x around known optima
        for rnd, what, best, grid in (("lr", "lr", 0.5 * n**-0.4, (0.5, 1, 2)),
                                      ("batch", "batch", 2 * n**0.3, (0.5, 1, 2))):
            rows += [{"round": rnd, "variant": "default", "N": n, "budget": 1e10, what: best * f,
                      "loss": 3 + 0.1 * np.log(f * 1.2) ** 2} for f in grid]
        rows += [{"round": "beta2", "variant": "default", "N": n, "budget": 1e10, "beta2": b,
                  "loss": 3 + d} for b, d in ((0.95, 0.05), (0.99, 0.0))]
    runs = pd.DataFrame(rows)
    t = VariantTune(lr=fit_lr_law(runs[runs["round"] == "lr"]),
                    batch=fit_power_law(runs[runs["round"] == "batch"], "batch"),
                    beta2=choose_beta2(runs[runs["round"] == "beta2"]))
    tuned = {"default": t}
    plots = [plot_tune(runs[runs["round"] == "lr"], tuned, tmp_path / "tune.png"),
             plot_hparams(runs, tuned, tmp_path / "tune_hparams.png")]
    tune = TuneResult(tuned, runs, tmp_path, plots, {}, ["batch factor 4 dropped at N=1,000"])
    files = write_report(results, tmp_path / "rep", tune=tune)
    assert {"tune.png", "tune_hparams.png"} <= {p.name for p in files}
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in plots)
    md = (tmp_path / "rep" / "report.md").read_text()
    for needle in ("## Hyperparameters per size", "Rounds lr, batch, beta2", t.lr.describe(),
                   t.batch.describe(), "**beta2 = 0.99**", "![tune stage](tune_hparams.png)",
                   "note: batch factor 4 dropped"):
        assert needle in md, needle


@pytest.mark.parametrize(("epochs", "needle"), [
    (None, None),
    (0.5, "- Data: every point trains on fresh tokens (at most 0.50 epochs"),
    (3.0, "- **Data repetition:** 14 of 14 points train on more tokens than the train split holds, "
          "up to 3.0 epochs (3.0–3.0 at the largest budget)"),
])
def test_report_says_whether_points_repeated_their_data(tmp_path, epochs, needle):
    runs = isoflop_runs(budgets=(1e18, 1e19), sizes_per_budget=7, noise=0.0, seed=0)
    if epochs is not None:
        runs["epochs"] = epochs
    res = fit_scaling_laws(runs, options=FitOptions(approaches=[2], n_boot=0, extrapolate=False))
    write_report(res, tmp_path)
    md = (tmp_path / "report.md").read_text()
    if needle is None:
        assert "Data repetition" not in md and "fresh tokens" not in md
    else:
        assert needle in md
