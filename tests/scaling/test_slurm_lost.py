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
        "SLURM job 7_1 lost its node (NODE_FAIL); SLURM requeued it")
    assert lost_note("7_1", ["NODE_FAIL", "CANCELLED"]) == (
        "SLURM job 7_1 lost its node (NODE_FAIL); then CANCELLED")
    assert lost_note("7_1", ["BOOT_FAIL", "NODE_FAIL"]).endswith("(NODE_FAIL)")
