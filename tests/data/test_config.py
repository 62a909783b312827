"""Config dataclasses: validation names the key; the yaml presets list only what differs."""

from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from scalelab.data import DataConfig, TokenizerConfig

CONF = Path(__file__).resolve().parents[2] / "src" / "scalelab" / "conf"


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"name": "wikipedia"}, "data.name"),
        ({"encoding_errors": "loose"}, "data.encoding_errors"),
        ({"val_fraction": 0.0}, "data.val_fraction"),
        ({"val_fraction": 1.5}, "data.val_fraction"),
        ({"dtype": "int8"}, "data.dtype"),
        ({"task": "multiply"}, "data.task"),
        ({"min_len": 5, "max_len": 2}, "data.min_len"),
        ({"name": "text_files"}, "data.paths"),
        ({"name": "hf"}, "data.hf_name"),
        ({"name": "parallel_text"}, "data.path"),
        ({"max_bytes": 0}, "data.max_bytes"),
    ],
)
def test_data_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DataConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"name": "sentencepiece"}, "tokenizer.name"),
        ({"name": "bpe", "vocab_size": 100}, "tokenizer.vocab_size"),
        ({"name": "bpe", "vocab_size": None}, "tokenizer.vocab_size"),
        ({"bpe_max_train_bytes": 0}, "tokenizer.bpe_max_train_bytes"),
    ],
)
def test_tokenizer_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        TokenizerConfig(**kwargs)


def test_unknown_key_in_dict():
    with pytest.raises(ValueError, match=r"data\.colour"):
        DataConfig.from_dict({"name": "pystdlib", "colour": "red"})
    assert TokenizerConfig.from_dict({"name": "char"}).name == "char"


@pytest.mark.parametrize("group,cls", [("data", DataConfig), ("tokenizer", TokenizerConfig)])
def test_yaml_presets_list_only_what_differs_from_the_dataclass(group, cls):
    """The dataclass is the one source of every field and default: a preset names itself and
    the values it changes, so a new field is added in data/config.py only."""
    files = sorted((CONF / group).glob("*.yaml"))
    assert files, f"no yaml in conf/{group}"
    order = [f.name for f in fields(cls)]
    default = cls()
    for f in files:
        d = yaml.safe_load(f.read_text())
        d.pop("defaults", None)
        assert "name" in d, f"{f}: a preset names its corpus or tokenizer"
        assert set(d) <= set(order), f"{f}: unknown keys {sorted(set(d) - set(order))}"
        assert list(d) == [k for k in order if k in d], f"{f}: keys out of the dataclass's order"
        same = [k for k, v in d.items() if k != "name" and v == getattr(default, k)]
        assert not same, f"{f}: {same} repeat the dataclass default"
        cls(**d)  # and it validates


def test_omegaconf_structured_config_accepts_the_dataclasses():
    from omegaconf import OmegaConf

    for cls in (DataConfig, TokenizerConfig):
        c = OmegaConf.structured(cls)
        obj = OmegaConf.to_object(c)
        assert isinstance(obj, cls)
