"""Turn an FSDP sharded checkpoint folder into one plain Lightning checkpoint file.

    python -m scalelab.cli.consolidate outputs/<run>/checkpoints/last.ckpt [-o last.full.ckpt]

The result loads with ``torch.load(weights_only=True)`` like any single-device checkpoint, so
``scalelab-sample``/``scalelab-export`` (and a non-FSDP resume) can use it. Runs on CPU.
"""

from __future__ import annotations

import argparse
import sys

from scalelab.training.checkpoint import consolidate_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scalelab.cli.consolidate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="the sharded checkpoint folder FSDP wrote")
    p.add_argument("-o", "--output", default=None,
                   help="output file (default: <folder>.consolidated.ckpt next to it)")
    args = p.parse_args(argv)
    try:
        out = consolidate_checkpoint(args.checkpoint, args.output)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
