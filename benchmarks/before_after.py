"""Total CPU seconds of one full scalelab-train run from two checkouts, side by side.

    python -m benchmarks.before_after OLD/src NEW/src [steps] [hydra overrides ...]

Both runs start together with 1 torch thread and their own temporary MLflow store; CPU time
(from wait4) stays comparable on a shared machine where wall time does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    srcs = {"old": argv[0], "new": argv[1]}
    steps = int(argv[2]) if len(argv) > 2 else 150
    data_dir = Path(__file__).resolve().parents[1] / "data_cache"
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-before-after-"))
    procs = {}
    for name, src in srcs.items():
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "SCALELAB_OMP_AUTO")}
        env["PYTHONPATH"] = src
        args = [sys.executable, "-m", "scalelab.cli.train", f"train.max_steps={steps}",
                "train.num_threads=1", f"paths.output_dir={tmp}/{name}", f"paths.data_dir={data_dir}",
                f"logger.tracking_uri=sqlite:///{tmp}/{name}.db",
                f"logger.artifact_root={tmp}/{name}_art", *argv[3:]]
        procs[name] = (subprocess.Popen(args, env=env, cwd=Path(src).parent,
                                        stdout=subprocess.DEVNULL), time.time())
    cpu = {}
    for name, (p, t0) in procs.items():
        _, status, ru = os.wait4(p.pid, 0)
        summary = json.loads((tmp / name / "summary.json").read_text())
        cpu[name] = ru.ru_utime + ru.ru_stime
        print(f"{name}: {srcs[name]} exit {os.waitstatus_to_exitcode(status)}, CPU {cpu[name]:.1f} s, "
              f"wall {time.time() - t0:.0f} s, val loss {summary.get('final_val_loss')}")
    print(f"new/old CPU seconds: {cpu['new'] / cpu['old']:.3f}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
