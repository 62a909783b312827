"""``python -m benchmarks [train] [OPTIONS] [-- OVERRIDES]`` (make bench): the training bench.

Three sides per preset, in turns on the same batches and config: (1) a hand-written GPT in a
plain torch loop, (2) scalelab's Transformer in that loop, (3) the whole ``scalelab-train``.
Prints each side's tokens/s, (2)/(1), (3)/(2), time to first step and the share of a default
run spent on validation, samples and checkpoints; exits 1 when a figure misses its target.
``--compare PATH`` runs side (3) of the checkout at PATH (old) and of this one (new) in turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = {  # presets, rounds, platform steps per run, optimizer steps per turn
    "quick": (["shakespeare_char", "pystdlib_small"], 1, 110, 1),
    "full": (["shakespeare_char", "pystdlib_small", "llama", "encoder", "encdec", "sweep_point"], 3, 300, 1),
    # a GPU step is queued: turns of 10 steps let each side's host work overlap its kernels
    "gpu": (["gpt2_124m", "llama_124m"], 2, 200, 10),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks [train]", description=__doc__.split("\n\n")[1],
                                 epilog="Hydra overrides after -- go to every side.")
    ap.add_argument("--full", action="store_true", help="every CPU preset, 3 rounds, 300 steps")
    ap.add_argument("--gpu", action="store_true", help="GPU presets: bf16, torch.compile, fused AdamW")
    ap.add_argument("--presets", help="comma-separated; CPU: shakespeare_char, pystdlib_small, "
                    "llama, encoder, encdec, sweep_point; --gpu: gpt2_124m, llama_124m")
    ap.add_argument("--rounds", type=int, help="rounds per preset (medians over rounds)")
    ap.add_argument("--steps", type=int, help="optimizer steps per platform run")
    ap.add_argument("--threads", type=int, help="threads of every side (default: torch's; sweep_point 1)")
    ap.add_argument("--compare", metavar="PATH", type=Path,
                    help="side (3) of the checkout at PATH (old) against this one (new), in turns")
    ap.add_argument("--to-loss", action="store_true",
                    help="wall time for the platform to reach the reference's val loss")
    ap.add_argument("--loss-tolerance", type=float,
                    help="--to-loss: val loss above the reference's that counts as reached (0.005)")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")],
                    help="--to-loss: a seed a round, both sides (e.g. 1337,1,2)")
    ap.add_argument("--ref-own-init", action="store_true",
                    help="--to-loss: the reference draws its own initial weights")
    ap.add_argument("--platform-override", action="append", default=[],
                    help="--to-loss: an override for the platform side only (a recipe change)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    return ap


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options, and the Hydra overrides after ``--``; a leading ``train`` is accepted."""
    argv = argv[1:] if argv[:1] == ["train"] else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.compare is not None and not (args.compare / "src" / "scalelab").is_dir():
        raise ValueError(f"--compare {args.compare}: no src/scalelab there; give a scalelab checkout")
    if args.gpu and (args.compare or args.to_loss):
        raise ValueError("--gpu: runs the three sides only; drop --compare/--to-loss")
    return args, extra


def plan(args: argparse.Namespace) -> tuple[list[str], int, int, int]:
    presets, rounds, steps, turn = MODES["gpu" if args.gpu else "full" if args.full else "quick"]
    return (args.presets.split(",") if args.presets else presets, args.rounds or rounds,
            args.steps or steps, turn)


def run(args: argparse.Namespace, extra: list[str]) -> tuple[list[dict[str, Any]], list[str], str]:
    """The mode's results, the figures off target, and its table."""
    import torch

    from benchmarks import harness, to_loss, verdict
    from benchmarks.presets import PRESET_THREADS, preset_overrides

    if args.gpu and not torch.cuda.is_available():
        raise ValueError("--gpu: no CUDA device here")
    presets, rounds, steps, turn = plan(args)
    for name in presets:
        preset_overrides(name, gpu=args.gpu)  # an unknown preset fails before any run
    default_threads = torch.get_num_threads()
    results = []
    with tempfile.TemporaryDirectory(prefix="scalelab-bench-") as tmp:
        for name in presets:
            threads = args.threads or PRESET_THREADS.get(name, default_threads)
            torch.set_num_threads(threads)
            print(f"== {name}: {threads} thread{'s' * (threads > 1)}", flush=True)
            if args.to_loss:
                tol = to_loss.LOSS_TOLERANCE if args.loss_tolerance is None else args.loss_tolerance
                results.append(to_loss.bench_to_loss(
                    name, preset_overrides(name), rounds, Path(tmp), threads, extra,
                    args.platform_override, own_init=args.ref_own_init, seeds=args.seeds, tolerance=tol))
            elif args.compare:
                results.append(harness.compare_preset(name, args.compare.resolve() / "src", rounds, steps,
                                                      Path(tmp), threads, extra=extra))
            else:
                results.append(harness.bench_preset(name, rounds, steps, Path(tmp), threads, args.gpu,
                                                    extra, turn))
    if args.to_loss:
        return results, to_loss.misses(results), verdict.table(results, to_loss.COLUMNS)
    table = verdict.table(results, verdict.COMPARE if args.compare else verdict.THREE_SIDES)
    for r in results:
        if r.get("platform_mfu") is not None:
            table += (f"\n  {r['preset']} on {r['device']}: steady-state MFU " + ", ".join(
                f"{s} {100 * r[f'{s}_mfu']:.1f}%" for s in ("ref", "model", "platform") if f"{s}_mfu" in r))
    return results, verdict.misses(results), table


def main(argv: list[str]) -> int:
    t0 = time.time()
    try:
        args, extra = parse(argv)
        results, missed, table = run(args, extra)
    except (ValueError, RuntimeError) as e:  # bad input, or a run that failed (its log's end)
        print(f"benchmarks: {e}", file=sys.stderr)
        return 2
    print(table)
    for m in missed:
        print(f"  BELOW TARGET {m}")
    if args.json:
        args.json.write_text(json.dumps({"argv": argv, "presets": results,
                                         "missed": missed, "seconds": time.time() - t0}, indent=2) + "\n")
    print(f"benchmarks: {time.time() - t0:.0f} s, {'targets met' if not missed else 'targets missed'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
