"""Data: tokenizers (tiktoken engine), corpora, token shards and one DataModule per objective.

The names load lazily, so importing ``scalelab.data.config`` or ``.files`` (plain Python, used
by every layer) does not pull in numpy, tiktoken or Lightning.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "DataBundle": "bundle",
    "build_data_bundle": "bundle",
    "DataConfig": "config",
    "TokenizerConfig": "config",
    "PreparedData": "shards",
    "prepare": "shards",
    "Tokenizer": "tokenizers",
    "load_tokenizer": "tokenizers",
    "CausalLMDataModule": "datamodules",  # DataModules import lightning
    "MaskedLMDataModule": "datamodules",
    "Seq2SeqDataModule": "datamodules",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'scalelab.data' has no attribute {name!r}")
    return getattr(import_module(f"scalelab.data.{_WHERE[name]}"), name)
