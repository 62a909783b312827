"""Everything a training run takes from the data side, for its objective, in one object.

The one place that branches on the objective for data: causal and MLM read prepared token
shards (``prepare``); seq2seq generates its pairs on the fly with its own character vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.data.shards import PreparedData, prepare
from scalelab.data.tokenizers import prepared_run_spec


@dataclass
class DataBundle:
    make_datamodule: Callable[[], Any]  # builds the run's LightningDataModule (see datamodule)
    vocab_size: int
    tokenizer: Any  # encode/decode for samples (a Tokenizer, or the seq2seq CharVocab)
    tokenizer_spec: dict[str, Any]  # persisted in checkpoints: what resume checks against
    bytes_per_token: float
    prepared: PreparedData | None = None  # the token shards (None for seq2seq)

    @cached_property
    def datamodule(self) -> Any:
        """The CausalLM/MaskedLM/Seq2Seq DataModule, built on first use: it imports Lightning,
        and the checks that need only the vocabulary (a checkpoint's shape and tokenizer) come
        first."""
        return self.make_datamodule()

    @property
    def source(self) -> str:
        """Where the tokens come from, for the start banner."""
        return str(self.prepared.dir) if self.prepared is not None else ""


def build_data_bundle(objective: str, data: DataConfig, tokenizer: TokenizerConfig, *,
                      micro_batch: int, block_size: int, seed: int, val_batches: int,
                      cache_dir: Path, progress: bool = True) -> DataBundle:
    """What a run of ``objective`` (causal | mlm | seq2seq) takes from the data: the token shards
    (prepared, or reused from ``cache_dir``), checked to hold a window in each split, their
    vocabulary and tokenizer, and the DataModule, built on first use."""
    if objective == "seq2seq":  # its DataModule makes the vocabulary: built at once
        from scalelab.data import datamodules

        dm = datamodules.Seq2SeqDataModule(data, batch_size=micro_batch, seed=seed)
        vocab = dm.vocab
        return DataBundle(lambda: dm, int(dm.vocab_size), vocab, vocab.spec(), bytes_per_token=1.0)
    prepared = prepare(data, tokenizer, cache_dir=cache_dir, progress=progress)
    for split in ("train", "val"):  # an input check, before the DataModule imports Lightning
        prepared.split_tokens(split, block_size, shifted=objective != "mlm")

    def make_datamodule() -> Any:
        from scalelab.data import datamodules  # imports Lightning

        module_class = datamodules.MaskedLMDataModule if objective == "mlm" else datamodules.CausalLMDataModule
        return module_class(prepared, block_size=block_size, batch_size=micro_batch, seed=seed,
                            val_batches=val_batches)

    tok_spec = prepared_run_spec(prepared.dir, prepared.meta.get("tokenizer", {}))
    return DataBundle(make_datamodule, int(prepared.vocab_size), prepared.tokenizer, tok_spec,
                      bytes_per_token=float(prepared.bytes_per_token), prepared=prepared)
