"""Which process may have side effects (MLflow runs, output folders, prints).

One place, so the scale-out work (DDP, torchrun, SLURM) only has to change this file. The
environment is read the same way Lightning reads it (``rank_zero_only.rank``), so the answer
is right before a Trainer exists: ranks > 0 of torchrun / the ranks scalelab starts itself /
srun must never create an MLflow run or a run folder.
"""

from __future__ import annotations

import os

_RANK_VARS = ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def global_rank() -> int:
    """Global rank of this process from the launcher's environment (0 when not distributed)."""
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            # SLURM_PROCID is set in every SLURM job; with one task per node the rank is
            # NODE_RANK * devices + LOCAL_RANK, which Lightning exports as RANK anyway.
            if var == "SLURM_PROCID" and int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
                continue
            return int(value)
    # the node's rank 0 (training/distributed.py) or Lightning's launcher sets LOCAL_RANK and NODE_RANK
    local = os.environ.get("LOCAL_RANK", "0")
    node = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    if local.isdigit() and node.isdigit():
        per_node = os.environ.get("LOCAL_WORLD_SIZE", "1")
        return int(node) * max(int(per_node) if per_node.isdigit() else 1, 1) + int(local)
    return 0


def is_global_zero() -> bool:
    """True in the one process that talks to MLflow and writes the run folder."""
    return global_rank() == 0
