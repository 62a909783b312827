"""argparse types for numbers with a meaning: an impossible value (``--max-new-tokens -5``,
``--temperature -1``, ``--tokens 0``) is refused by argparse with exit 2, naming the option,
instead of running and printing NaN."""

from __future__ import annotations

import argparse
import math


def _number(kind: type, text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of tokens, samples, sequences)."""
    value = int(_number(int, text))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (``--top-k 0``: no top-k cut)."""
    value = int(_number(int, text))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def temperature(text: str) -> float:
    """A sampling temperature >= 0 (0: greedy)."""
    value = float(_number(float, text))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0 (0 is greedy decoding)")
    return value
