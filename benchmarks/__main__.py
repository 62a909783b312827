"""Run every benchmarks/bench_*.py module's main() in name order; exit 1 if one fails."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path


def main() -> int:
    failed = []
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        name = f"benchmarks.{path.stem}"
        print(f"== {name}", flush=True)
        try:
            importlib.import_module(name).main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
