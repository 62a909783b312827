"""The training bench: three sides measured in the same seconds, or two checkouts' platforms.

Per preset and round, a ``scalelab-train`` run (3) takes turns with the bench: after each of its
turns, the bench runs as many steps of (2) scalelab's ``Transformer`` and (1) the hand-written
reference in a plain loop on the run's batches, then hands the turn back (A B C A B C ...), so a
change of the machine's load hits all three alike. ``compare_preset`` makes two checkouts' runs
take turns the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.lockstep import PausedRun, take_turns
from benchmarks.plain_loop import PlainLoop
from benchmarks.platform_run import PlatformRun, projected_overhead, rate
from benchmarks.presets import ROOT, prepare_preset, preset_overrides
from benchmarks.verdict import fmt, median, median_ratio

WARMUP_TURNS = 2  # left out of every side's rate: the first turns pay for caches and allocations


def turn_order(sides: list[str], k: int) -> list[str]:
    """The plain loops' order in turn ``k``: neither always runs right after the platform."""
    return sides if k % 2 == 0 else sides[::-1]


def compare_order(round_index: int) -> tuple[str, str]:
    """Which checkout starts first (alone; the other starts while it waits) in a round."""
    return ("old", "new") if round_index % 2 == 0 else ("new", "old")


class PlainTurns:
    """The bench's turn: ``steps`` steps of each plain loop, in :func:`turn_order`."""

    def __init__(self, loops: dict[str, PlainLoop], steps: int) -> None:
        self.loops, self.steps, self.k = loops, steps, 0

    def __call__(self) -> dict[str, tuple[float, float, int]]:
        order, self.k = turn_order(list(self.loops), self.k), self.k + 1
        return {side: self.loops[side].timed_turn(self.steps) for side in order}


def run_overrides(preset: list[str], steps: int, threads: int, gpu: bool, extra: list[str] | None) -> list[str]:
    """The preset's overrides, then ``steps`` steps with a validation mid-run as well as at the
    end (its cost is measured), on a CPU in fp32 with the plain loops' threads; the user's last."""
    cpu = [] if gpu else ["trainer.precision=32-true", f"train.num_threads={threads}"]
    return [*preset, *cpu, f"train.max_steps={steps}", f"train.val_every={max(1, steps // 2)}", *(extra or [])]


def bench_preset(name: str, rounds: int, steps: int, workdir: Path, threads: int, gpu: bool = False,
                 extra: list[str] | None = None, turn_steps: int = 1, log: Any = print) -> dict[str, Any]:
    """Sides (1), (2) and (3) of one preset: medians over rounds of tokens/s and of each round's
    ratios, time to first step, and the overhead share projected to the experiment's own run."""
    from benchmarks.reference_gpt import ReferenceLM
    from scalelab.model import Transformer

    preset = preset_overrides(name, gpu=gpu)
    prep = prepare_preset([*preset, *(extra or [])])
    mcfg, device = prep["model_cfg"], "cuda" if gpu else "cpu"
    amp = torch.bfloat16 if gpu else None
    torch.manual_seed(0)
    loops = {"model": PlainLoop(Transformer(mcfg), prep, "model", device, amp, compile=gpu)}
    if mcfg.arch != "encoder_decoder":  # an encoder-decoder has no hand-written counterpart
        loops["ref"] = PlainLoop(ReferenceLM(mcfg), prep, "ref", device, amp, compile=gpu)
    for loop in loops.values():
        loop.timed_turn(3)
    done = []
    for r in range(rounds):
        run = PlatformRun.start(run_overrides(preset, steps, threads, gpu, extra), workdir,
                                lockstep=True, turn_steps=turn_steps, tag="new")
        try:
            turns = take_turns(run.proc, run.pipes, PlainTurns(loops, turn_steps))  # type: ignore[arg-type]
            got = {f"platform_{k}": v for k, v in run.finish().items()}
        finally:
            run.kill()
        turns = turns[WARMUP_TURNS:]
        got.update({f"{s}_tokens_per_s": rate([t[s] for t in turns]) for s in loops})
        done.append(got)
        log(f"  {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{s} {fmt(got.get(f'{s}_tokens_per_s'))}" for s in ("ref", "model", "platform"))
            + f" tok/s over {got['platform_turns']} turns; first step "
            f"{fmt(got['platform_time_to_first_step_s'], '.1f')} s")
    res: dict[str, Any] = {"preset": name, "threads": threads, "rounds": done,
                           "params": mcfg.n_params(), "device": device}
    res.update({f"{s}_tokens_per_s": median(done, f"{s}_tokens_per_s") for s in ("ref", "model", "platform")})
    res["model/ref"] = median_ratio(done, "model_tokens_per_s", "ref_tokens_per_s")
    res["platform/model"] = median_ratio(done, "platform_tokens_per_s", "model_tokens_per_s")
    res["time_to_first_step_s"] = median(done, "platform_time_to_first_step_s")
    spec = prep["spec"]  # the experiment's own run length and validation interval
    plat = {k: median(done, f"platform_{k}") for k in
            ("step_s", "val_event_s", "after_fit_s", "time_to_first_step_s")}
    res["overhead_share"] = projected_overhead(plat, spec.max_steps, spec.val_every)
    if gpu:  # steady-state MFU of each side against the GPU's bf16 peak
        from scalelab.training.perf import peak_flops

        per_token = mcfg.flops_per_token(seq_len=spec.block_size) / peak_flops("cuda", "bf16-mixed")
        res.update({f"{s}_mfu": res[f"{s}_tokens_per_s"] * per_token
                    for s in ("ref", "model", "platform") if res.get(f"{s}_tokens_per_s")})
        res["device"] = torch.cuda.get_device_name(0)
    return res


def compare_preset(name: str, old_src: Path, rounds: int, steps: int, workdir: Path, threads: int,
                   gpu: bool = False, extra: list[str] | None = None, turn_steps: int = 1,
                   log: Any = print) -> dict[str, Any]:
    """Side (3) of this checkout ("new") and of the one whose src folder is ``old_src``, taking
    turns; medians of tokens/s and of each round's new/old, first step and final val loss."""
    srcs = {"old": old_src, "new": ROOT / "src"}

    def start(side: str) -> PlatformRun:
        overrides = run_overrides(preset_overrides(name, srcs[side], gpu), steps, threads, gpu, extra)
        return PlatformRun.start(overrides, workdir, srcs[side],
                                 lockstep=True, turn_steps=turn_steps, tag=side)

    done = []
    for r in range(rounds):
        first, second = compare_order(r)
        runs, got = {first: start(first)}, {}
        try:
            paused = PausedRun(runs[first].pipes)  # type: ignore[arg-type]
            paused.wait_paused()  # its start-up alone; from here on it waits for its turns
            runs[second] = start(second)
            take_turns(runs[second].proc, runs[second].pipes, paused.turn)  # type: ignore[arg-type]
            for side in (second, first):
                got.update({f"{side}_{k}": v for k, v in runs[side].finish().items()})
        finally:
            for run in runs.values():
                run.kill()
        done.append(got)
        log(f"  {name} round {r + 1}/{rounds} ({first} started first): old "
            f"{fmt(got['old_tokens_per_s'])} tok/s, new {fmt(got['new_tokens_per_s'])} tok/s")
    res: dict[str, Any] = {"preset": name, "old_src": str(old_src), "threads": threads, "rounds": done}
    for key in ("tokens_per_s", "time_to_first_step_s", "val_loss"):
        for side in ("old", "new"):
            res[f"{side}_{key}"] = median(done, f"{side}_{key}")
    res["new/old"] = median_ratio(done, "new_tokens_per_s", "old_tokens_per_s")
    return res
