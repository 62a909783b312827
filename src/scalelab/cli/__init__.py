"""Thin Hydra/argparse entry points: scalelab-train, -sample, -export (and -data, -sweep, -fit).

The config they compose (schema, validation, compose) lives one layer down, in
``scalelab.config``; each Hydra entry point calls ``scalelab.config.schema.register()`` first.
"""

# Before torch loads libgomp (it reads OMP_WAIT_POLICY once): PASSIVE only when the cores are
# oversubscribed (a busy machine, parallel sweep points); forcing it always made 2 threads as
# slow as 1 on an idle machine. The rule and its measurements: scalelab/runtime.py.
from scalelab.runtime import apply_omp_env as _apply_omp_env
from scalelab.runtime import keep_freed_memory as _keep_freed_memory

_apply_omp_env()
# Freed activation buffers stay in the heap instead of being faulted in again every step.
_keep_freed_memory()
