"""How the sweep words a SLURM job lost with its node, from the states ``sacct -D`` lists for
it (oldest attempt first). The real node crash is tests/cluster/test_slurm.py."""

from __future__ import annotations

from scalelab.scaling.slurm_jobs import lost_note


def test_a_job_that_never_lost_its_node_is_not_lost() -> None:
    assert lost_note("7_0", ["COMPLETED"]) is None
    assert lost_note("7_0", ["CANCELLED"]) is None  # scancel: the run says KILLED itself


def test_a_lost_job_says_what_slurm_did_next() -> None:
    assert lost_note("7_1", ["NODE_FAIL"]) == "SLURM job 7_1 lost its node (NODE_FAIL)"
    assert lost_note("7_1", ["NODE_FAIL", "PENDING"]) == (
        "SLURM job 7_1 lost its node (NODE_FAIL); SLURM requeued it"
    )
    assert lost_note("7_1", ["NODE_FAIL", "CANCELLED"]) == (
        "SLURM job 7_1 lost its node (NODE_FAIL); then CANCELLED"
    )
    assert lost_note("7_1", ["BOOT_FAIL", "NODE_FAIL"]).endswith("(NODE_FAIL)")


def test_lost_points_fail_and_their_orphaned_runs_are_closed(tmp_path) -> None:
    """After a launch: what sacct said (here given) -> failed points, runs closed KILLED, and
    a lost point is not launched again by the same sweep. The store is a real SQLite one."""
    from types import SimpleNamespace

    from tests.conftest import sqlite_store

    from scalelab.scaling.slurm_jobs import LostJobs
    from scalelab.tracking.sweep import SweepParent

    parent = SweepParent.open(sqlite_store(tmp_path / "m.db"), "sweep_lost", "lost")
    points = [SimpleNamespace(name=f"p{i}", point_id=f"id{i}") for i in range(3)]
    runs = {}
    for p in points[:2]:  # p0 and p1 had started their runs when the node died
        tags = {"mlflow.parentRunId": parent.run_id, "sweep_point_id": p.point_id}
        runs[p.name] = parent.client.create_run(parent.experiment_id, tags=tags).info.run_id
    sacct = {
        0: ("5_0", ["NODE_FAIL", "CANCELLED"]),
        1: ("5_1", ["COMPLETED"]),
        2: ("5_2", ["NODE_FAIL"]),
    }
    said: list[str] = []
    lost = LostJobs(tmp_path, points, said.append, states=lambda _: sacct)
    failed: dict[str, str] = {}
    remaining = lost.settle({}, points[2:], failed, parent)
    assert remaining == []  # p2's job ran (and was lost): not "never started"
    assert failed == {
        "p0": "SLURM job 5_0 lost its node (NODE_FAIL); then CANCELLED; rerun "
        "the sweep to finish it",
        "p2": "SLURM job 5_2 lost its node (NODE_FAIL); rerun the sweep to finish it",
    }
    status = {n: parent.client.get_run(r).info.status for n, r in runs.items()}
    assert status == {"p0": "KILLED", "p1": "RUNNING"}  # p1's job was not lost
    assert sum("lost its node" in ln for ln in said) == 4  # each said once, then as failed
