"""The bench's turn-taking between a platform run and the bench (benchmarks/lockstep.py, the
PhaseTimer's lockstep mode) over real pipes and real child processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from benchmarks.lockstep import PausedRun, Pipes, take_turns
from benchmarks.phase_timer import PhaseTimer

# A child that takes turns as the PhaseTimer does: write a byte, wait for one back. It exits 3
# when a reply is missing, so the test sees that every turn was handed back.
CHILD = textwrap.dedent("""
    import os, sys, time
    r, w, n, linger = (int(a) for a in sys.argv[1:5])
    for _ in range(n):
        os.write(w, b"s")
        if os.read(r, 1) != b"g":
            sys.exit(3)
    time.sleep(linger)
""")


def _child(pipes: Pipes, turns: int, linger_s: int = 0) -> subprocess.Popen[bytes]:
    r, w = pipes.run_ends
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(r), str(w), str(turns), str(linger_s)],
                            pass_fds=pipes.run_ends)
    pipes.started()
    return proc


def test_take_turns_runs_one_step_per_turn_until_the_run_exits() -> None:
    pipes = Pipes()
    proc = _child(pipes, turns=7)
    steps: list[int] = []
    try:
        out = take_turns(proc, pipes, lambda: (steps.append(1), (0.01, 0.02, 5))[1])
        assert proc.wait(timeout=30) == 0  # every turn was handed back
    finally:
        proc.kill()
    assert len(out) == len(steps) == 7 and out[0] == (0.01, 0.02, 5)
    assert pipes.closed


def test_a_silent_run_is_killed_after_the_timeout() -> None:
    pipes = Pipes()
    proc = _child(pipes, turns=0, linger_s=60)  # never hands over a turn
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no step"):
            take_turns(proc, pipes, lambda: (0.0, 0.0, 0), timeout_s=1.0)
        assert time.monotonic() - t0 < 20
        assert proc.wait(timeout=30) != 0  # killed, not left behind
    finally:
        proc.kill()


def test_a_paused_run_gets_one_turn_per_call_until_it_ends() -> None:
    """--compare: the run that started first is the bench's turn for the other one."""
    pipes = Pipes()
    proc = _child(pipes, turns=3)
    try:
        paused = PausedRun(pipes, timeout_s=30)
        paused.wait_paused()  # its first turn handed over
        assert not paused.ended
        for _ in range(3):
            assert paused.turn() == (0.0, 0.0, 0)
        assert paused.ended  # the child wrote its 3 turns and exited
        paused.turn()  # nothing left to do, no error
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        pipes.close()


def _trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, callback_metrics={"val/loss": torch.tensor(2.5)})


def _batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(2, 50, dtype=torch.long)}


def test_phase_timer_takes_turns_and_records_cycles_and_pauses(tmp_path: Path) -> None:
    """Replies written ahead into a real pipe: the timer never blocks, and what it records can
    be checked turn by turn."""
    bench_reads, run_writes = os.pipe()
    run_reads, bench_writes = os.pipe()
    os.write(bench_writes, b"g" * 3)  # three turns handed back, then the bench is gone
    os.close(bench_writes)
    timer = PhaseTimer(str(tmp_path / "phases.json"), lockstep=f"{run_reads},{run_writes}", skip=1)
    module = SimpleNamespace(device=torch.device("cpu"))
    for step in range(1, 6):  # optimizer steps 1..5
        timer.on_train_batch_start(_trainer(step - 1), module, _batch(), step)
        if step == 3:
            timer.on_validation_start(_trainer(step), module)  # lands in cycle 2 -> 3
            timer.on_validation_end(_trainer(step), module)
        timer.on_train_batch_end(_trainer(step), module, None, _batch(), step)
    timer.on_fit_end(_trainer(5), module)
    # turns after steps 1, 2, 3 were answered; after step 4 the bench was gone (EOF)
    assert os.read(bench_reads, 16) == b"s" * 4
    assert timer.turns is not None and not timer.turns.active  # the bench was gone after 3 turns
    assert len(timer.turns.pauses) == 3
    assert [(c[2], c[3]) for c in timer.turns.cycles] == [(100, False), (100, True), (100, False)]
    assert all(c[0] >= 0 for c in timer.turns.cycles)
    record = json.loads((tmp_path / "phases.json").read_text())
    assert record["tokens"] == 500 and record["val_loss"] == 2.5 and record["final_step"] == 5
    assert len(record["val_gaps"]) == 1 and record["first_step_unix"] <= record["fit_end_unix"]
    os.close(bench_reads)
    os.close(run_reads)
    os.close(run_writes)


def test_phase_timer_hands_over_every_k_steps(tmp_path: Path) -> None:
    bench_reads, run_writes = os.pipe()
    run_reads, bench_writes = os.pipe()
    os.write(bench_writes, b"g" * 8)
    timer = PhaseTimer(str(tmp_path / "phases.json"), lockstep=f"{run_reads},{run_writes}", skip=1, every=3)
    module = SimpleNamespace(device=torch.device("cpu"))
    for step in range(1, 11):  # turns after steps 1, 4, 7, 10
        timer.on_train_batch_start(_trainer(step - 1), module, _batch(), step)
        timer.on_train_batch_end(_trainer(step), module, None, _batch(), step)
    timer.on_fit_end(_trainer(10), module)
    assert os.read(bench_reads, 16) == b"s" * 4
    assert timer.turns is not None and [c[2] for c in timer.turns.cycles] == [300, 300, 300]
    for fd in (bench_reads, bench_writes, run_reads):  # on_fit_end closed run_writes
        os.close(fd)
