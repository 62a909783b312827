"""Data: tokenizers (tiktoken engine), corpora, token shards and one DataModule per objective."""

from scalelab.data.bundle import DataBundle, build_data_bundle
from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.data.shards import PreparedData, prepare
from scalelab.data.tokenizers import Tokenizer, load_tokenizer

__all__ = [
    "CausalLMDataModule",
    "DataBundle",
    "DataConfig",
    "MaskedLMDataModule",
    "PreparedData",
    "Seq2SeqDataModule",
    "Tokenizer",
    "TokenizerConfig",
    "build_data_bundle",
    "load_tokenizer",
    "prepare",
]


def __getattr__(name: str):  # DataModules import lightning: load them only when asked for
    if name in ("CausalLMDataModule", "MaskedLMDataModule", "Seq2SeqDataModule"):
        from scalelab.data import datamodules

        return getattr(datamodules, name)
    raise AttributeError(name)
