"""The pystdlib_mc items, found next to this file (not relative to the current folder)."""

from pathlib import Path
from typing import Any


def load(cache_dir: str | None = None, **_: Any) -> Any:
    """lm-eval's custom_dataset hook (called with the task's metadata as keywords): a
    DatasetDict with the one split, "test"."""
    import datasets

    items = Path(__file__).resolve().with_name("pystdlib_mc.jsonl")
    return datasets.load_dataset("json", data_files={"test": str(items)}, cache_dir=cache_dir)
