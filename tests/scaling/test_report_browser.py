"""report.html read in a real browser: the answer comes first and every table fits the page.

A report of a synthetic study (fit, forecast, hold-out and a plan of the sweep's 20 columns) is
rendered by headless Chromium (scripts/ui_screenshot.py drives it over the DevTools protocol)
at 1280 x 800; the layout is read from the DOM. Skipped where no chromium binary is installed.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.scaling.synthetic import SMALL_LAW, family_shape, study_runs, true_optimum

from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
from scalelab.scaling.forecast import Forecast, ForecastRun, Target
from scalelab.scaling.forecast_stage import ForecastResult, target_table
from scalelab.scaling.published_laws import law_loss

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 1280, 800
CHROMIUM = pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                              reason="no chromium (apt-get install chromium)")
PLAN_COLUMNS = ["point", "variant", "budget", "N", "N_non_embedding", "N_matmul", "d_model",
                "n_layers", "n_heads", "D", "tokens_per_param", "C", "steps", "tokens_per_step", "lr",
                "beta2", "warmup_steps", "replicate", "stage", "run_name"]


def _forecast(study: pd.DataFrame, multiple: float = 4.0) -> ForecastResult:
    """A forecast at ``multiple`` x the largest budget whose runs trained to the true law."""
    budget = multiple * study["budget"].max()
    n_star = true_optimum(budget)[0]
    runs, rows = [], []
    for role, f in (("optimum", 1.0), ("larger", 2.0), ("smaller", 0.5)):
        shape = family_shape(n_star * f)
        d = budget / shape["flops_per_token"]
        actual = float(law_loss(n_star * f, d, SMALL_LAW))
        pred = actual * 0.99
        runs.append(ForecastRun(role, shape, d, pred, pred * 0.97, pred * 1.03, {"chinchilla": pred}))
        rows.append({"budget_multiple": multiple, "budget": budget, "role": role, "lr_factor": 1.0,
                     "batch_factor": 1.0, "N": shape["n_params_matmul"], "D": d, "lr": 3e-3,
                     "batch": 4096, "loss_pred": pred, "loss_lo": pred * 0.97, "loss_hi": pred * 1.03,
                     "loss_actual": actual, "error": actual / pred - 1, "covered": True,
                     "run_name": f"forecast{multiple:g}x-C{budget:.2g}-N{n_star * f:.2g}_0123abcd"})
    fc = Forecast([Target(multiple, budget, n_star, n_star * 0.7, n_star * 1.4, budget / 6 / n_star, runs)],
                  {"chinchilla": 0.004, "kaplan": 0.02}, ["chinchilla"], 0.005, "matmul")
    table = pd.DataFrame(rows)
    return ForecastResult(fc, target_table(fc, table), table, {}, study)


def _plan(study: pd.DataFrame) -> pd.DataFrame:
    """The sweep's plan table: one row per point, the 20 columns scalelab-sweep writes."""
    pts = study.drop_duplicates("group_id")
    rows = [{"point": f"C{r.budget:.2g}-N{r.n_params_matmul:.2g}_e5953d7e", "variant": "default",
             "budget": r.budget, "N": round(r.n_params), "N_non_embedding": round(r.n_params_non_embedding),
             "N_matmul": round(r.n_params_matmul), "d_model": 64, "n_layers": 2, "n_heads": 2,
             "D": round(r.D), "tokens_per_param": r.D / r.n_params_matmul, "C": round(r.budget),
             "steps": round(r.D / 4096), "tokens_per_step": 4096, "lr": 3e-3, "beta2": None,
             "warmup_steps": 20, "replicate": 0, "stage": "main",
             "run_name": f"C{r.budget:.2g}-N{r.n_params_matmul:.2g}_e5953d7e"} for r in pts.itertuples()]
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    study = study_runs(budgets=(4e9, 1e10, 2.5e10, 6.3e10), sizes=6, seeds=2)
    runs = study.assign(N=study["n_params_matmul"], run_id=[f"r{i}" for i in range(len(study))])
    results = fit_scaling_laws(runs, options=FitOptions(approaches=(2, 3), grid="coarse", n_boot=6,
                                                        boot_grid="none"))
    out = tmp_path_factory.mktemp("report")
    write_report(results, out, plan=_plan(study), forecast=_forecast(study))
    return out / "report.html"


# where the answer, the FLOPs paragraph and the plan sit, and how wide each table and image is
LAYOUT_JS = """(() => {
  const top = el => el ? el.getBoundingClientRect().top + window.scrollY : null;
  const h2 = t => [...document.querySelectorAll('h2')].find(h => h.textContent.trim() === t);
  const answer = h2('Answer');
  const flops = [...document.querySelectorAll('strong')].find(
      s => s.textContent.startsWith('One FLOPs convention'));
  return JSON.stringify({
    viewport: window.innerWidth, page: document.documentElement.scrollWidth,
    answer: top(answer), answer_end: answer ? answer.nextElementSibling.getBoundingClientRect().bottom : null,
    answer_text: answer ? answer.nextElementSibling.innerText : '',
    flops: top(flops), plan: top(h2('Plan')),
    forecast: top(h2('Forecast vs outcome')),
    tables: [...document.querySelectorAll('table')].map(t => ({
      width: t.scrollWidth, box: t.parentElement.clientWidth,
      right: t.getBoundingClientRect().right, columns: t.rows[0].cells.length})),
    images: [...document.images].map(i => ({natural: i.naturalWidth, right: i.getBoundingClientRect().right})),
  }); })()"""


def render(html: Path, png: Path | None = None, width: int = WIDTH, height: int = HEIGHT) -> dict:
    """Load ``html`` in headless Chromium; the layout (LAYOUT_JS), and a PNG of the first screen."""
    import base64

    sys.path.insert(0, str(REPO / "scripts"))
    from ui_screenshot import Chromium

    chrome = Chromium(width, height)
    try:
        target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
        chrome.session = chrome.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        chrome.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                    deviceScaleFactor=1, mobile=False)
        chrome.call("Page.navigate", url=html.as_uri())
        deadline = time.monotonic() + 120  # a loaded machine: a bound, not a pace
        while chrome.js("document.readyState") != "complete":
            assert time.monotonic() < deadline, "report.html did not finish loading"
            time.sleep(0.1)
        layout = json.loads(chrome.js(LAYOUT_JS))
        if png is not None:
            png.write_bytes(base64.b64decode(chrome.call("Page.captureScreenshot", format="png")["data"]))
        return layout
    finally:
        chrome.close()


@CHROMIUM
def test_report_html_opens_on_the_answer_and_fits_the_page(report, tmp_path):
    layout = render(report, tmp_path / "first_screen.png")
    assert (tmp_path / "first_screen.png").read_bytes()[:4] == b"\x89PNG"
    # the answer first: above the forecast, the FLOPs paragraph and the plan, on the first screen
    assert layout["answer"] is not None and layout["flops"] is not None and layout["plan"] is not None
    assert layout["answer"] < layout["forecast"] < layout["flops"] < layout["plan"], layout
    assert layout["answer_end"] <= HEIGHT, layout["answer_end"]
    for needle in ("a = ", "b = ", "Forecast at 4x", "covered", "Hold-out check", "error"):
        assert needle in layout["answer_text"], (needle, layout["answer_text"])
    # no sideways scrolling: the page, every table (the 20-column plan too) and every image fit
    assert layout["page"] <= layout["viewport"], layout["page"]
    assert max(t["columns"] for t in layout["tables"]) == len(PLAN_COLUMNS)
    for t in layout["tables"]:
        assert t["width"] <= t["box"] and t["right"] <= layout["viewport"], t
    assert len(layout["images"]) >= 5  # loss vs tokens, IsoFLOP, frontier, parametric, forecast
    for img in layout["images"]:
        assert img["natural"] > 0 and img["right"] <= layout["viewport"], img


def test_report_md_puts_the_answer_before_the_details(report):
    md = report.with_suffix(".md").read_text()
    order = [md.index(s) for s in ("## Answer", "## Forecast vs outcome", "One FLOPs convention",
                                   "## Fit", "## Plan")]
    assert order == sorted(order), order
    answer = md[order[0]:order[1]]
    assert answer.count("\n- ") == 3, answer  # a and b; the forecast's one target; the hold-out
    assert "[" in answer.split("**a = ", 1)[1].split("**", 1)[0], answer  # a with its interval
    assert np.isfinite(float(answer.split("L* = ", 1)[1].split(" ", 1)[0]))
