"""collect.py against a real (SQLite) MLflow store: parent/children -> the fit's tables."""

from __future__ import annotations

import time

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from scalelab.scaling.collect import collect, collect_runs
from scalelab.scaling.fit_data import FitOptions, prepare_curves, prepare_runs
from scalelab.tracking.sweep import SweepParent, find_sweep_parent

pytestmark = pytest.mark.slow  # a real MLflow SQLite store takes seconds to create
TPS = 1024


def _child(client: MlflowClient, parent: SweepParent, point_id: str, status: str, n: int,
           budget: float, loss: float, variant: str = "default") -> str:
    tags = {"mlflow.parentRunId": parent.run_id, "sweep_point_id": point_id,
            "sweep_point": f"p_{point_id}", "sweep_budget": f"{budget:g}",
            "sweep_variant": variant, "sweep_size_index": "1"}
    run = client.create_run(parent.experiment_id, run_name=f"r_{point_id}", tags=tags)
    rid = run.info.run_id
    fpt = 6 * n + 1000
    steps = int(budget / fpt / TPS)
    params = {"n_params": n + 500, "n_params_non_embedding": n - 300, "n_params_matmul": n,
              "flops_per_token": fpt, "flops_per_token_6n": 6 * n, "global_batch_tokens": TPS,
              "max_steps": steps, "tokens_budget": steps * TPS, "d_model": 32, "n_layers": 2,
              "n_heads": 2, "lr": 1e-3}
    now = int(time.time() * 1000)
    metrics = [Metric("val/loss", loss + 2.0 / (s + 1), now, s) for s in (10, 20, steps)]
    metrics += [Metric("tokens_seen", s * TPS, now, s) for s in (10, 20, steps)]
    metrics += [Metric("final/val_loss", loss, now, steps), Metric("final/val_bpb", loss / 0.69, now, steps),
                Metric("final/tokens_seen", steps * TPS, now, steps)]
    client.log_batch(rid, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()])
    client.set_terminated(rid, status=status)
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/m.db"
    parent = SweepParent.open(uri, "sweep_t", "t")
    client = parent.client
    ids = {
        "a_old": _child(client, parent, "a", "FINISHED", 20_000, 1e12, 3.0),
        "b_failed": _child(client, parent, "b", "FAILED", 40_000, 1e12, 9.9),
        "a_new": _child(client, parent, "a", "FINISHED", 20_000, 1e12, 2.9),
        "c": _child(client, parent, "c", "FINISHED", 80_000, 1e12, 2.8),
    }
    return uri, parent, ids


def test_parent_is_reopened_not_duplicated(store):
    uri, parent, _ = store
    again = SweepParent.open(uri, "sweep_t", "t")
    assert again.run_id == parent.run_id and not again.created
    assert find_sweep_parent(uri, "t").run_id == parent.run_id
    assert find_sweep_parent(uri, "nope") is None


def test_collect_latest_finished_per_point(store):
    _, parent, ids = store
    got = collect(parent)
    assert sorted(got.runs["run_id"]) == sorted([ids["a_new"], ids["c"]])
    a = got.runs.set_index("run_id").loc[ids["a_new"]]
    assert a["N"] == 20_000 == a["n_params_matmul"]  # matmul convention by default
    assert a["loss"] == pytest.approx(2.9)
    assert a["D"] == a["steps"] * TPS  # final/tokens_seen
    assert a["C"] == pytest.approx((6 * 20_000 + 1000) * a["D"])
    assert a["flops_6n"] == pytest.approx(6 * 20_000 * a["D"])
    assert a["budget"] == 1e12 and a["variant"] == "default"
    assert list(got.failed["run_id"]) == [ids["b_failed"]]
    # curves: each val/loss step times the tokens per step (global_batch_tokens)
    cur = got.curves[got.curves["run_id"] == ids["a_new"]]
    assert list(cur["tokens"]) == [10 * TPS, 20 * TPS, a["steps"] * TPS]
    assert cur["flops"].iloc[0] == pytest.approx(10 * TPS * (6 * 20_000 + 1000))


def test_conventions_and_filter(store):
    _, parent, ids = store
    got = collect(parent, n_convention="total", flops_convention="6n", point_ids={"c"}, curves=False)
    assert list(got.runs["run_id"]) == [ids["c"]]
    assert got.runs["N"].iloc[0] == 80_500
    assert got.runs["C"].iloc[0] == pytest.approx(6 * 80_000 * got.runs["D"].iloc[0])
    with pytest.raises(ValueError, match="n_convention"):
        collect(parent, n_convention="kaplan")


def test_tables_are_what_the_fit_reads(store):
    uri, _, _ = store
    runs, curves = collect_runs(sweep="t", tracking_uri=uri)
    table = prepare_runs(runs, FitOptions())
    assert list(table["N"]) == list(runs["n_params_matmul"])
    assert list(table["C"]) == pytest.approx(list(runs["flops"]))
    assert len(prepare_curves(curves, table)) == len(curves)
    with pytest.raises(ValueError, match="no sweep named"):
        collect_runs(sweep="missing", tracking_uri=uri)
