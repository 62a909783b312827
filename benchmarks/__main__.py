"""`python -m benchmarks [NAME] [ARGS]`: run benchmarks/bench_NAME.py (ARGS go to it), or every
bench_*.py in name order (ARGS go to bench_train). Exit 1 if one fails or misses a target.

    python -m benchmarks                 # bench_prepare + bench_train quick mode
    python -m benchmarks train --full    # only the training bench, full mode
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    names = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    if argv and f"bench_{argv[0]}" in names:
        names, args = [f"bench_{argv[0]}"], {f"bench_{argv[0]}": argv[1:]}
    else:
        args = {"bench_train": argv}
    failed = []
    for stem in names:
        name = f"benchmarks.{stem}"
        print(f"== {name}", flush=True)
        try:
            rc = importlib.import_module(name).main(args.get(stem, []))
        except Exception:
            traceback.print_exc()
            rc = 1
        if isinstance(rc, int) and rc:  # bench_prepare returns its figures, bench_train a code
            failed.append(name)
    if failed:
        print(f"failed or below target: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
