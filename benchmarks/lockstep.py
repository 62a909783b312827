"""Turn-taking between a ``scalelab-train`` run and the bench, through two pipes: a shared
machine's speed drifts within seconds, so sides timed one after another would compare two
different machines. The run's ``PhaseTimer`` writes a byte after each turn of optimizer steps
and waits; the bench runs its own turn (plain-loop steps, or a second run's turn) and writes a
byte back, so every side's steady state comes from the same seconds."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Pipes:
    """The bench's ends (``from_run``, ``to_run``) and the run's (``run_ends``: it reads, it
    writes), which the run gets through ``pass_fds`` and ``callback_arg``."""

    def __init__(self) -> None:
        run_reads, self.to_run = os.pipe()
        self.from_run, run_writes = os.pipe()
        self.run_ends, self.closed = (run_reads, run_writes), False
        self.callback_arg = f"{run_reads},{run_writes}"

    def started(self) -> None:
        """The run has its copies: close ours, so its exit reads as end-of-file here."""
        for fd in self.run_ends:
            os.close(fd)

    def close(self) -> None:
        if not self.closed:
            os.close(self.from_run)
            os.close(self.to_run)
            self.closed = True


def wait_byte(fd: int, timeout_s: float) -> bytes:
    """One byte from ``fd``; b"" at end of file. TimeoutError when none comes in ``timeout_s``."""
    if not select.select([fd], [], [], timeout_s)[0]:
        raise TimeoutError(f"the platform run sent no step for {timeout_s:.0f} s")
    return os.read(fd, 1)


def take_turns(proc: subprocess.Popen[Any], pipes: Pipes, turn: Callable[[], T],
               timeout_s: float = 900.0) -> list[T]:
    """Call ``turn`` once per turn the run hands over, until the run closes its end or exits;
    what each call returned. A run silent for ``timeout_s`` is killed."""
    out: list[T] = []
    try:
        while True:
            try:
                if not wait_byte(pipes.from_run, timeout_s):
                    return out  # end of file: the fit ended (or the run died; its exit code says)
            except TimeoutError:
                proc.kill()
                raise
            out.append(turn())
            try:
                os.write(pipes.to_run, b"g")
            except BrokenPipeError:
                return out
    finally:
        pipes.close()


class PausedRun:
    """A second run as the bench's turn: ``turn`` lets it run one turn and waits until it
    pauses again (the run times its own turns). Once it has ended, a turn does nothing."""

    def __init__(self, pipes: Pipes, timeout_s: float = 900.0) -> None:
        self.pipes, self.timeout_s, self.ended = pipes, timeout_s, False

    def wait_paused(self) -> None:
        self.ended = not wait_byte(self.pipes.from_run, self.timeout_s)

    def turn(self) -> tuple[float, float, int]:
        if not self.ended:
            try:
                os.write(self.pipes.to_run, b"g")
                self.wait_paused()
            except BrokenPipeError:
                self.ended = True
        return 0.0, 0.0, 0


class RunTurns:
    """The run's side. ``hand_over`` closes the current *cycle* (from getting the turn back to
    now: wall, CPU, tokens since, whether a validation ran in it), writes a byte and waits for
    one back; the wait is a *pause*. When the bench is gone, ``active`` turns False and the run
    trains on alone."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd, self.active = read_fd, write_fd, True
        self.cycles: list[tuple[float, float, int, bool]] = []
        self.pauses: list[tuple[float, float]] = []
        self.validated = False  # set by the caller when a validation ran in this cycle
        self._resumed: tuple[float, float, int] | None = None

    @classmethod
    def from_arg(cls, arg: str | None) -> RunTurns | None:  # "R,W", the callback's argument
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
        self.active = bool(handed_back)
        if self.active:
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
