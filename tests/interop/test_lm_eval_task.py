"""docs/lm_eval: the local lm-evaluation-harness task loads from any folder, scores a choice
right after the context (no space put in between), and has enough items with spread labels."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pytest

TASK = Path(__file__).resolve().parents[2] / "docs" / "lm_eval"


def test_the_task_is_large_balanced_and_needs_no_space() -> None:
    items = [json.loads(line) for line in (TASK / "pystdlib_mc.jsonl").read_text().splitlines()]
    assert len(items) >= 200
    labels = Counter(it["label"] for it in items)
    assert set(labels) == {0, 1, 2, 3} and max(labels.values()) - min(labels.values()) <= 1
    for it in items:
        assert len(it["choices"]) == 4 and len(set(it["choices"])) == 4
        assert all(" " <= c <= "~" or c == "\n" for c in it["context"] + "".join(it["choices"]))
    yaml = (TASK / "pystdlib_mc.yaml").read_text()
    assert 'target_delimiter: ""' in yaml
    assert "custom_dataset: !function pystdlib_mc_data.load" in yaml
    assert "data_files" not in yaml  # a path there is relative to the current folder


def test_the_loader_finds_the_items_from_another_folder(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    spec = importlib.util.spec_from_file_location("pystdlib_mc_data", TASK / "pystdlib_mc_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        ds = module.load(version=2.0, cache_dir=str(tmp_path / "cache"))
    finally:
        os.chdir(old)
    first = json.loads((TASK / "pystdlib_mc.jsonl").read_text().splitlines()[0])
    assert ds["test"].num_rows >= 200 and ds["test"][0] == first
