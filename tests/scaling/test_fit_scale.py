"""scalelab-fit on many rows and on too few: memory bounded whatever the row count, duplicated
rows merged with a warning, nothing fitted is exit 2 with the reason."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from tests.scaling.synthetic import isoflop_runs

from scalelab.cli.fit import main as fit_main
from scalelab.scaling.fit_parametric import fit_parametric
from scalelab.scaling.published_laws import EPOCH_2024


def test_many_rows_fit_in_bounded_memory_and_recover_the_law() -> None:
    # 60k rows x 108 starts held at once would be ~50 MB per array and ~30 arrays (1.5 GB);
    # numpy reports its buffers to tracemalloc, so the peak is measured, not guessed
    runs = isoflop_runs(budgets=(1e18, 1e19, 1e20, 1e21, 1e22), sizes_per_budget=12_000,
                        noise=0.005, seed=3, law=EPOCH_2024)
    tracemalloc.start()
    try:
        fit = fit_parametric(runs["N"], runs["D"], runs["loss"], grid="coarse")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 300e6, f"peak {peak / 1e6:.0f} MB"
    for key in ("E", "alpha", "beta"):
        assert getattr(fit, key) == pytest.approx(EPOCH_2024[key], rel=0.03), key


def _csv(tmp_path: Path, rows: int, dup: int = 0) -> Path:
    runs = isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=rows // 3, noise=0.005,
                        seed=4, law=EPOCH_2024)
    runs = runs.drop(columns="run_id")  # without run ids a pasted row looks like a new run
    path = tmp_path / "runs.csv"
    runs.iloc[list(range(len(runs))) + list(range(dup))].to_csv(path, index=False)
    return path


@pytest.mark.parametrize("keep", [False, True])
def test_duplicated_rows_are_merged_with_a_warning_unless_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], keep: bool) -> None:
    csv = _csv(tmp_path, 12, dup=4)
    args = ["--csv", str(csv), "--approaches", "2", "--n-boot", "0",
            "--no-extrapolate", "--no-report"]
    assert fit_main(args + (["--keep-duplicates"] if keep else [])) == 0
    out = capsys.readouterr()
    text = " ".join(out.out.split())
    if keep:
        assert "duplicated" not in out.err and "16 runs" in text
    else:
        assert "4 duplicated row(s)" in out.err and "--keep-duplicates" in out.err
        assert "12 runs" in text


def test_too_few_points_for_any_approach_is_exit_2_with_the_reasons(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.csv"
    one.write_text("N,D,loss\n1e6,2e7,3.1\n")
    assert fit_main(["--csv", str(one), "--n-boot", "0", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no approach could be fitted" in err
    for reason in ("Approach 1 left out", "Approach 2 needs", "Approach 3 needs >= 5 runs, got 1"):
        assert reason.split(", got")[0] in err, err
