"""Global batch -> per-device micro-batch and gradient accumulation, and token budgets -> steps.

The global batch (what the optimizer sees per step) is the experiment's setting; it stays fixed
when the device count changes, and accumulation makes up the difference.
"""

from __future__ import annotations

import math
from typing import NamedTuple

UNITS = ("sequences", "tokens")


class BatchPlan(NamedTuple):
    micro_batch: int  # sequences per device per forward/backward (DataModule batch_size)
    grad_accum: int  # Trainer(accumulate_grad_batches=...)
    global_batch_sequences: int  # sequences per optimizer step, all devices
    tokens_per_step: int  # global_batch_sequences * block_size


def derive_batch(
    global_batch_size: int,
    micro_batch_size: int | None,
    world_size: int,
    block_size: int,
    unit: str = "sequences",
) -> BatchPlan:
    """Split a global batch over ``world_size`` devices.

    ``unit="tokens"`` means ``global_batch_size`` counts tokens and must be a multiple of
    ``block_size``. ``micro_batch_size=None`` puts the whole per-device share in one micro-batch
    (no accumulation). Raises ValueError naming the numbers when they do not divide.
    """
    for name, v in (("global_batch_size", global_batch_size), ("world_size", world_size),
                    ("block_size", block_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    if unit not in UNITS:
        raise ValueError(f"batch unit={unit!r}: choose 'sequences' or 'tokens'")
    if micro_batch_size is not None and (not isinstance(micro_batch_size, int) or micro_batch_size < 1):
        raise ValueError(f"micro_batch_size={micro_batch_size!r}: must be a positive integer or null")

    if unit == "tokens":
        if global_batch_size % block_size:
            raise ValueError(
                f"global batch of {global_batch_size} tokens is not a multiple of block_size={block_size}; "
                f"use e.g. {max(1, round(global_batch_size / block_size)) * block_size} tokens"
            )
        seqs = global_batch_size // block_size
    else:
        seqs = global_batch_size

    if micro_batch_size is None:
        if seqs % world_size:
            raise ValueError(
                f"global batch of {seqs} sequences does not split over {world_size} devices; "
                f"make it a multiple of {world_size} or set a micro batch size"
            )
        micro, accum = seqs // world_size, 1
    else:
        per_step = micro_batch_size * world_size
        if seqs % per_step:
            raise ValueError(
                f"global batch of {seqs} sequences is not a multiple of micro_batch_size "
                f"({micro_batch_size}) x devices ({world_size}) = {per_step}; change the global batch "
                f"to a multiple of {per_step} or pick a micro batch size that divides {seqs // world_size if seqs % world_size == 0 else seqs}"
            )
        micro, accum = micro_batch_size, seqs // per_step
    return BatchPlan(micro, accum, seqs, seqs * block_size)


def steps_from_budget(max_tokens: int, tokens_per_step: int) -> int:
    """Optimizer steps for a token budget: the fewest steps that see at least ``max_tokens``."""
    # Hydra may hand over 1e6 as a float; accept whole numbers.
    if isinstance(max_tokens, float) and max_tokens.is_integer():
        max_tokens = int(max_tokens)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r}: must be a positive whole number of tokens")
    if not isinstance(tokens_per_step, int) or tokens_per_step < 1:
        raise ValueError(f"tokens_per_step={tokens_per_step!r}: must be a positive integer")
    return math.ceil(max_tokens / tokens_per_step)
