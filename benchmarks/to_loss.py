"""``--to-loss``: the platform's wall time to the reference's validation loss (target <= 0.8x).

Per round, each side is one process timed from start to exit: (1) the hand-written model
(reference_gpt.py), from the platform's initial weights (``--ref-own-init``: its own draw), in a
plain loop over the experiment's train batches, AdamW settings, lr schedule and steps, then one
validation on the experiment's validation windows; (2) the full ``scalelab-train`` at the
experiment's defaults with Lightning's ``EarlyStopping`` at the reference's val loss plus
``--loss-tolerance``. A round that never reaches it counts as an infinite ratio. Both sides
train one recipe from one start, so what separates their last losses is precision (bf16 lands
either side of fp32); the default tolerance is half of "the same loss in bf16" (0.01) and below
the reference's seed-to-seed spread. ``--loss-tolerance 0`` is the strict rule.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.platform_run import PlatformRun, source_env
from benchmarks.presets import ROOT
from benchmarks.verdict import Column, median

CHILD = "--_ref-child"
OWN_INIT = "--own-init"
TARGET = 0.8  # platform wall / reference wall, at most
LOSS_TOLERANCE = 0.005  # "reached": val loss <= the reference's + this (the module docstring says why)


def _val_loss(model: Any, dm: Any, objective: str) -> float:
    import torch
    import torch.nn.functional as F

    model.eval()
    loss_sum, n = 0.0, 0
    with torch.no_grad():
        for b in dm.val_dataloader():
            logits = model(b["input_ids"])
            labels = b["labels"].flatten()
            loss_sum += float(F.cross_entropy(logits.flatten(0, 1).float(), labels,
                                              ignore_index=-100, reduction="sum"))
            n += int((labels != -100).sum())
    model.train()
    return loss_sum / max(n, 1)


def reference_model(model_cfg: Any, seed: int, own_init: bool) -> Any:
    """The hand-written model, from the platform's own initial draw (``torch.manual_seed(seed);
    Transformer(cfg)``) unless ``own_init``: a draw of its own moves the last val loss by more
    than any speed or precision effect this compares."""
    import torch

    from benchmarks.reference_gpt import ReferenceLM, state_from_transformer
    from scalelab.model import Transformer

    torch.manual_seed(seed)
    ref = ReferenceLM(model_cfg)
    if not own_init:
        torch.manual_seed(seed)
        ref.load_state_dict(state_from_transformer(Transformer(model_cfg)))
    return ref


def train_batches(dm: Any, steps: int) -> Iterator[dict[str, Any]]:
    """``steps`` train batches in the order ``scalelab-train`` trains on them: through the
    DataModule's ``on_before_batch_transfer`` hook, which counts batches, so a new epoch goes on
    where the last one ended instead of replaying the first."""
    batches = iter(dm.train_dataloader())
    for _ in range(steps):
        try:
            batch = next(batches)
        except StopIteration:  # an epoch ended: the next one starts at the count
            batches = iter(dm.train_dataloader())
            batch = next(batches)
        yield dm.on_before_batch_transfer(batch, 0)


def ref_child(overrides: list[str], own_init: bool = False) -> None:
    """Subprocess body: train the reference for the experiment's steps; print JSON."""
    import torch

    from benchmarks.plain_loop import PlainLoop
    from benchmarks.presets import prepare_preset
    from scalelab.training.schedules import build_lr_lambda

    if os.environ.get("SCALELAB_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["SCALELAB_BENCH_THREADS"]))
    prep = prepare_preset(overrides, n_batches=1)
    spec, dm = prep["spec"], prep["datamodule"]
    loop = PlainLoop(reference_model(prep["model_cfg"], int(prep["cfg"].seed), own_init), prep, "ref")
    sched = torch.optim.lr_scheduler.LambdaLR(loop.opt, build_lr_lambda(spec.optim, spec.max_steps))
    t0 = time.perf_counter()
    for batch in train_batches(dm, spec.max_steps):
        loop.batches, loop.i = [batch], 0
        loop.step()
        sched.step()
    train_s = time.perf_counter() - t0
    print(json.dumps({"val_loss": _val_loss(loop.model, dm, spec.objective),
                      "steps": spec.max_steps, "train_s": train_s}))


def run_ref(overrides: list[str], threads: int, own_init: bool = False) -> dict[str, Any]:
    env = {**source_env(ROOT / "src"), "SCALELAB_BENCH_THREADS": str(threads)}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.to_loss", CHILD, *[OWN_INIT] * own_init, *overrides],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": wall}


def early_stop_override(threshold: float) -> str:
    # EarlyStopping stops when val/loss < threshold (strict); the tiny margin makes "equal" count.
    return ("+callbacks.to_loss={_target_: pytorch_lightning.callbacks.EarlyStopping, "
            f"monitor: val/loss, mode: min, stopping_threshold: {threshold + 1e-6!r}, "
            "patience: 1000000, check_on_train_epoch_end: false}")


def reached(val_loss: float | None, target: float) -> bool:
    """At most ``target`` (the reference's loss plus the tolerance), equal counted as reached."""
    return val_loss is not None and val_loss <= target + 1e-6


def _round(overrides: list[str], workdir: Path, threads: int, platform_only: list[str],
           own_init: bool, tolerance: float) -> dict[str, Any]:
    """One reference run, then one platform run that stops at the reference's loss (+ tolerance)."""
    ref = run_ref(overrides, threads, own_init)
    target = ref["val_loss"] + tolerance
    run = PlatformRun.start([*overrides, *platform_only, f"train.num_threads={threads}",
                             early_stop_override(target)], workdir, tag="to_loss")
    try:
        plat = run.finish()
    finally:
        run.kill()
    ok = reached(plat["val_loss"], target)
    return {**{f"ref_{k}": ref[k] for k in ("val_loss", "wall_s", "steps", "train_s")},
            **{f"platform_{k}": plat[k] for k in ("val_loss", "wall_s", "steps")},
            "reached": ok, "strict": reached(plat["val_loss"], ref["val_loss"]),
            "val_gap": plat["val_loss"] - ref["val_loss"], "walls": plat["wall_s"] / ref["wall_s"],
            "wall_ratio": plat["wall_s"] / ref["wall_s"] if ok else math.inf}


def bench_to_loss(name: str, overrides: list[str], rounds: int, workdir: Path, threads: int,
                  extra: list[str] | None = None, platform_only: list[str] | None = None,
                  log: Any = print, own_init: bool = False, seeds: list[int] | None = None,
                  tolerance: float = LOSS_TOLERANCE) -> dict[str, Any]:
    """``extra``: overrides for both sides; ``platform_only``: a recipe change tried on the
    platform alone (reported as such); ``seeds``: round r runs both sides at seed
    ``seeds[r % len(seeds)]``; ``tolerance``: how far above the reference's loss still counts.
    Medians over rounds; ``walls`` is each round's wall ratio whether it reached the loss or not."""
    done = []
    for r in range(rounds):  # A B A B: a change of load hits both sides alike
        seed = seeds[r % len(seeds)] if seeds else None
        both = [*overrides, *(extra or []), *([f"seed={seed}"] if seed is not None else [])]
        d = {"seed": seed, **_round(both, workdir, threads, platform_only or [], own_init, tolerance)}
        done.append(d)
        log(f"  to-loss {name} round {r + 1}/{rounds}{'' if seed is None else f' seed {seed}'}: ref val {d['ref_val_loss']:.4f} in "
            f"{d['ref_wall_s']:.1f} s; platform val {d['platform_val_loss']:.4f} at step {d['platform_steps']} "
            f"in {d['platform_wall_s']:.1f} s ({'reached' if d['reached'] else 'NOT reached'})")
    res: dict[str, Any] = {k: median(done, k) for k in (
        "ref_val_loss", "ref_steps", "ref_wall_s", "platform_steps", "platform_wall_s", "val_gap", "walls")}
    n_reached, n_strict = sum(d["reached"] for d in done), sum(d["strict"] for d in done)
    return {**res, "preset": name, "platform_wall/ref_wall": statistics.median(d["wall_ratio"] for d in done),
            "reached": n_reached, "strict": n_strict, "rounds": len(done), "loss_tolerance": tolerance,
            "reached_of": f"{n_reached}/{len(done)}", "strict_of": f"{n_strict}/{len(done)}",
            "per_round": done, "platform_only_overrides": platform_only or [],
            "ref_init": "own" if own_init else "platform's"}


COLUMNS: list[Column] = [
    ("ref steps", "ref_steps", ".0f"), ("ref val", "ref_val_loss", ".4f"), ("ref wall", "ref_wall_s", "s"),
    ("plat steps", "platform_steps", ".0f"), ("plat wall", "platform_wall_s", "s"),
    ("val gap", "val_gap", "+.4f"), ("walls", "walls", ".2f"), ("reached", "reached_of", ""),
    ("strict", "strict_of", ""), ("wall 3/1", "platform_wall/ref_wall", ".2f")]


def misses(results: list[dict[str, Any]]) -> list[str]:
    return [f"{r['preset']}: time to the reference's val loss (+{r.get('loss_tolerance', 0):g}) "
            f"{r['platform_wall/ref_wall']:.2f}x the reference's wall > {TARGET}"
            for r in results if r["platform_wall/ref_wall"] > TARGET]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        ref_child([a for a in sys.argv[2:] if a != OWN_INIT], own_init=OWN_INIT in sys.argv)
