"""Thin Hydra/argparse entry points: scalelab-train, -sample, -export (and -data, -sweep, -fit).

Importing ``scalelab.cli.schema`` registers the structured-config schema (``train_schema``) and
the ``${scalelab.root:}`` / ``${scalelab.run_dir:...}`` resolvers that ``conf/`` uses.
"""

import os as _os

# Before torch loads libgomp: on a busy CPU (parallel sweep points, CI, a shared laptop),
# OpenMP threads that spin-wait between ops waste most of the machine; measured here on a
# loaded 2-core box, nano GPT training went from ~240 to ~4300 tokens/s. Set it to ACTIVE to opt out.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
