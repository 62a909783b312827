"""A model.safetensors whose header was edited (offsets past the end of the file, broken
JSON) is refused while the config is validated, naming the file: before any folder, data or
MLflow run exists."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from scalelab.config.compose import compose
from scalelab.config.spec import build_spec

GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 16, "n_layer": 1,
        "n_head": 2}


def _hf_folder(tmp_path: Path, tamper: str | None) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    path = folder / "model.safetensors"
    save_file({"wte.weight": torch.zeros(64, 16)}, str(path))
    if tamper is None:
        return folder
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    if tamper == "offsets":
        header["wte.weight"]["data_offsets"] = [0, 10**12]
    text = json.dumps(header).encode() if tamper == "offsets" else b"{not json" + b" " * n
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    return folder


@pytest.mark.parametrize("tamper", ["offsets", "json"])
def test_a_tampered_header_is_refused_at_config_time(tmp_path: Path, tamper: str) -> None:
    folder = _hf_folder(tmp_path, tamper)
    with pytest.raises(ValueError) as e:
        build_spec(compose("train", [f"model.init_from=hf:{folder}"]))
    text = str(e.value)
    assert text.startswith("model.init_from=") and "model.safetensors: not a valid safetensors" in text


def test_an_intact_folder_passes_the_check(tmp_path: Path) -> None:
    spec = build_spec(compose("train", [f"model.init_from=hf:{_hf_folder(tmp_path, None)}",
                                        "train.block_size=32"]))
    assert spec.model.d_model == 16
