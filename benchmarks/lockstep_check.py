"""A/A check of the bench's turn-taking: the same plain loop on both sides.

The bench's (3)/(2) comes from a platform run and the plain loop taking turns (lockstep.py).
Here the platform run is replaced by a second copy of the plain loop in a child process that
takes turns the way the PhaseTimer does, so the true ratio is 1 and what the check prints is
the method's own error.

    python -m benchmarks.lockstep_check [--rounds 4] [--turns 150] [hydra overrides ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_train import ROOT, PlainLoop, lockstep_rates, prepare_preset
from benchmarks.lockstep import Pipes, RunTurns, take_turns

CHILD = "--_child"


def plain_loop(overrides: list[str]) -> PlainLoop:
    from scalelab.model import Transformer

    prep = prepare_preset(overrides)
    torch.manual_seed(0)
    return PlainLoop(Transformer(prep["model_cfg"]), prep, "model")


def child(read_fd: int, write_fd: int, turns: int, out: str, overrides: list[str]) -> None:
    """The platform side's part, played by a plain loop taking turns as PhaseTimer does."""
    loop = plain_loop(overrides)
    for _ in range(3):
        loop.step()
    run, tokens = RunTurns(read_fd, write_fd), 0
    for _ in range(turns):
        loop.step()
        tokens += loop.last_tokens
        run.hand_over((time.perf_counter(), time.process_time()), tokens)
    Path(out).write_text(json.dumps(run.record()))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--turns", type=int, default=150)
    args, overrides = ap.parse_known_args(argv)
    from scalelab.runtime import thread_plan

    threads = thread_plan().threads
    torch.set_num_threads(threads)
    loop = plain_loop(overrides)
    for _ in range(20):
        loop.step()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cycles.json"
        for r in range(args.rounds):
            pipes = Pipes.open()
            cmd = [sys.executable, "-m", "benchmarks.lockstep_check", CHILD, str(threads),
                   *map(str, pipes.run_ends), str(args.turns), str(out), *overrides]
            proc = subprocess.Popen(cmd, pass_fds=pipes.run_ends, cwd=ROOT)
            try:
                pipes.started()
                turns = take_turns(proc, pipes, loop.timed_turn)
            finally:
                proc.wait()
            res = lockstep_rates(json.loads(out.read_text()), turns)
            ratios.append(res["tokens_per_s"] / res["partner_tokens_per_s"])
            print(f"round {r + 1}: child {res['tokens_per_s']:,.0f} vs bench "
                  f"{res['partner_tokens_per_s']:,.0f} tok/s, ratio {ratios[-1]:.3f}", flush=True)
    print(f"A/A ratios (true value 1): {min(ratios):.3f} .. {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        torch.set_num_threads(int(sys.argv[2]))  # the parent's plan: both sides alike
        child(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7:])
    else:
        sys.exit(main(sys.argv[1:]))
