"""Everything a training run takes from the data side, for its objective, in one object.

The one place that branches on the objective for data: causal and MLM read prepared token
shards (``prepare``); seq2seq generates its pairs on the fly with its own character vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.data.shards import PreparedData, prepare
from scalelab.data.tokenizers import prepared_run_spec


@dataclass
class DataBundle:
    datamodule: Any  # a LightningDataModule (CausalLM/MaskedLM/Seq2Seq DataModule)
    vocab_size: int
    tokenizer: Any  # encode/decode for samples (a Tokenizer, or the seq2seq CharVocab)
    tokenizer_spec: dict[str, Any]  # persisted in checkpoints: what resume checks against
    bytes_per_token: float
    prepared: PreparedData | None = None  # the token shards (None for seq2seq)

    @property
    def source(self) -> str:
        """Where the tokens come from, for the start banner."""
        return str(self.prepared.dir) if self.prepared is not None else ""


def build_data_bundle(objective: str, data: DataConfig, tokenizer: TokenizerConfig, *,
                      micro_batch: int, block_size: int, seed: int, val_batches: int,
                      cache_dir: Path, progress: bool = True) -> DataBundle:
    """The DataModule for ``objective`` (causal | mlm | seq2seq) and what the run needs to know
    about its vocabulary; token shards are prepared (or reused from ``cache_dir``) first."""
    # datamodules imports Lightning: only once the shards are ready (a bad input fails sooner)
    if objective == "seq2seq":
        from scalelab.data import datamodules

        dm = datamodules.Seq2SeqDataModule(data, batch_size=micro_batch, seed=seed)
        vocab = dm.vocab
        return DataBundle(dm, int(dm.vocab_size), vocab,
                          vocab.spec(),
                          bytes_per_token=1.0)
    prepared = prepare(data, tokenizer, cache_dir=cache_dir, progress=progress)
    from scalelab.data import datamodules

    module_class = datamodules.MaskedLMDataModule if objective == "mlm" else datamodules.CausalLMDataModule
    dm = module_class(prepared, block_size=block_size, batch_size=micro_batch, seed=seed,
                      val_batches=val_batches)
    tok_spec = prepared_run_spec(prepared.dir, prepared.meta.get("tokenizer", {}))
    return DataBundle(dm, int(prepared.vocab_size), prepared.tokenizer, tok_spec,
                      bytes_per_token=float(prepared.bytes_per_token), prepared=prepared)
