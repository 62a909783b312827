"""Time to the first step of scalelab-train from two checkouts, interleaved (A B B A ...).

    python -m benchmarks.first_step_ab OLD/src NEW/src [rounds]

Three presets (the default experiment, shakespeare_char, the Llama-style one), 3 steps each, the
data cache and both SQLite stores built in an unrecorded first round. Each run reports
``final/time_to_first_step`` (process start to the end of the first optimizer step); the
medians and their ratio are printed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {
    "pystdlib_small": [],
    "shakespeare_char": ["+experiment=shakespeare_char",
                         f"data.path={ROOT.parent / 'shared' / 'data' / 'tinyshakespeare.txt'}"],
    "llama": ["+experiment=llama_tiny_pystdlib"],
}


def first_step(src: str, preset: list[str], work: Path, side: str, tag: str) -> float:
    out = work / f"{side}_{tag}"
    cmd = [sys.executable, "-m", "scalelab.cli.train", *preset, "train.max_steps=3",
           "optim.warmup_steps=1", "train.val_every=1000", "callbacks.sample.enabled=false",
           "logger.log_checkpoint=false", f"paths.output_dir={out}", f"paths.data_dir={work}/data",
           f"logger.tracking_uri=sqlite:///{work}/{side}.db", f"logger.artifact_root={work}/arts"]
    r = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": src}, cwd=Path(src).parent,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{side} failed:\n{r.stderr[-2000:]}")
    return float(json.loads((out / "summary.json").read_text())["metrics"]["final/time_to_first_step"])


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    sides = {"old": argv[0], "new": argv[1]}
    rounds = int(argv[2]) if len(argv) > 2 else 3
    work = Path(tempfile.mkdtemp(prefix="scalelab-first-step-"))
    times: dict[str, dict[str, list[float]]] = {p: {s: [] for s in sides} for p in PRESETS}
    for r in range(rounds + 1):  # round 0 builds the caches and stores: not recorded
        order = list(sides.items()) if r % 2 else list(reversed(sides.items()))
        for preset, overrides in PRESETS.items():
            for side, src in order:
                t = first_step(src, overrides, work, side, f"{preset}_{r}")
                if r:
                    times[preset][side].append(t)
    print(f"{'preset':<18} {'old (s)':<20} {'new (s)':<20} new/old (medians)")
    for preset, by_side in times.items():
        old, new = (statistics.median(by_side[s]) for s in sides)
        print(f"{preset:<18} {' '.join(f'{t:.2f}' for t in by_side['old']):<20} "
              f"{' '.join(f'{t:.2f}' for t in by_side['new']):<20} {new / old:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
