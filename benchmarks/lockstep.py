"""Turn-taking between a ``scalelab-train`` run and the bench, through two pipes.

A shared machine's speed can drift by several per cent within seconds, so step times of one
run measured after another compare two different machines. The run's ``PhaseTimer`` writes a
byte after each turn of optimizer steps and waits; the bench runs its own turn (plain-loop
steps, or a turn of a second run) and writes a byte back. Every side's steady state then comes
from the same seconds.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pipes:
    """The bench's ends and the run's ends of the two pipes."""

    from_run: int
    to_run: int
    run_ends: tuple[int, int]  # (the run reads, the run writes): passed down with pass_fds
    closed: bool = field(default=False)

    @classmethod
    def open(cls) -> Pipes:
        run_reads, to_run = os.pipe()
        from_run, run_writes = os.pipe()
        return cls(from_run, to_run, (run_reads, run_writes))

    @property
    def callback_arg(self) -> str:
        return f"{self.run_ends[0]},{self.run_ends[1]}"

    def started(self) -> None:
        """The run has its copies: close ours, so its exit reads as end-of-file here."""
        for fd in self.run_ends:
            os.close(fd)

    def close(self) -> None:
        if not self.closed:
            for fd in (self.from_run, self.to_run):
                os.close(fd)
            self.closed = True


def wait_byte(fd: int, timeout_s: float) -> bytes:
    """One byte from ``fd``; b"" at end of file. TimeoutError when none comes in ``timeout_s``."""
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"the platform run sent no step for {timeout_s:.0f} s")
    return os.read(fd, 1)


def take_turns(proc: subprocess.Popen[Any], pipes: Pipes, step: Callable[[], tuple[float, float, int]],
               timeout_s: float = 900.0) -> list[tuple[float, float, int]]:
    """Run ``step`` (returns wall s, CPU s, tokens) once per turn the run hands over, until the
    run closes its end or exits. A run silent for ``timeout_s`` is killed."""
    out: list[tuple[float, float, int]] = []
    try:
        while True:
            try:
                got = wait_byte(pipes.from_run, timeout_s)
            except TimeoutError:
                proc.kill()
                raise
            if not got:
                return out  # end of file: the run's fit ended (or it died; its exit code says)
            out.append(step())
            try:
                os.write(pipes.to_run, b"g")
            except BrokenPipeError:
                return out
    finally:
        pipes.close()


class PausedRun:
    """A second run as the bench's turn: ``turn`` lets it run one turn and waits until it
    pauses again. Once it has ended, a turn does nothing."""

    def __init__(self, pipes: Pipes, timeout_s: float = 900.0) -> None:
        self.pipes, self.timeout_s, self.ended = pipes, timeout_s, False

    def wait_paused(self) -> None:
        """Until the run's first turn is over (its start-up and first steps done)."""
        self.ended = not wait_byte(self.pipes.from_run, self.timeout_s)

    def turn(self) -> tuple[float, float, int]:
        if not self.ended:
            try:
                os.write(self.pipes.to_run, b"g")
                self.wait_paused()
            except BrokenPipeError:
                self.ended = True
        return 0.0, 0.0, 0  # the run times its own turns (PhaseTimer)


class RunTurns:
    """The run's side of the turns (PhaseTimer's lockstep mode).

    ``hand_over`` after each optimizer step closes the current *cycle* (from getting the turn
    back to now: wall, CPU, tokens since, whether a validation ran in it), writes a byte and
    waits for one back. The wait is a *pause* (wall, and the CPU this process's threads used
    meanwhile). When the bench is gone, ``active`` turns False and the run trains on alone."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd, self.active = read_fd, write_fd, True
        self.cycles: list[tuple[float, float, int, bool]] = []
        self.pauses: list[tuple[float, float]] = []
        self.validated = False  # set by the caller when a validation ran in this cycle
        self._resumed: tuple[float, float, int] | None = None

    @classmethod
    def from_arg(cls, arg: str | None) -> RunTurns | None:
        """``"R,W"`` (the callback argument) or None."""
        return cls(*(int(f) for f in str(arg).split(","))) if arg else None

    def hand_over(self, now: tuple[float, float], tokens: int) -> tuple[float, float]:
        """Close this cycle, hand the turn to the bench; returns (wall, CPU) when it is back."""
        if self._resumed is not None:
            wall0, cpu0, tokens0 = self._resumed
            self.cycles.append((now[0] - wall0, now[1] - cpu0, tokens - tokens0, self.validated))
        try:
            os.write(self.write_fd, b"s")
            handed_back = os.read(self.read_fd, 1)
        except OSError:  # the bench is gone
            handed_back = b""
        back = time.perf_counter(), time.process_time()
        if not handed_back:
            self.active = False
            return back
        self.pauses.append((back[0] - now[0], back[1] - now[1]))
        self._resumed, self.validated = (back[0], back[1], tokens), False
        return back

    def close(self) -> None:
        """End of the run's turns: the bench's loop sees end-of-file."""
        if self.active:
            os.close(self.write_fd)
            self.active = False

    def record(self) -> dict[str, list]:
        return {"cycles": self.cycles, "pauses": self.pauses}
