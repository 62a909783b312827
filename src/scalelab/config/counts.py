"""Counts written in scientific notation: ``train.max_tokens=5e6`` means 5,000,000.

Hydra parses ``5e6`` as a float, and an ``int`` schema field rejects it. The count fields are
typed ``Any`` in config/schema.py and go through ``as_count`` here instead, which accepts whole
numbers in any spelling (``5000000``, ``5_000_000``, ``5e6``, ``"5e6"``) and refuses the rest
with the key's name.
"""

from __future__ import annotations

from typing import Any


def as_count(key: str, value: Any) -> int | None:
    """``value`` as a whole number (None stays None); ValueError naming ``key`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{key}={value}: expected a whole number, e.g. {key}=5e6")
    if isinstance(value, int):
        return value
    try:
        number = float(str(value).replace("_", ""))
    except ValueError:
        raise ValueError(f"{key}={value!r}: expected a whole number, e.g. {key}=5e6") from None
    if not number.is_integer():
        raise ValueError(f"{key}={value}: must be a whole number (got a fraction)")
    return int(number)
