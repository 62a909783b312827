"""Lightning DataModules, one per objective: causal LM, masked LM (BERT), seq2seq.

Training batches form a deterministic stream: batch ``b`` of rank ``r`` is drawn from
``np.random.default_rng([seed, r, b])`` (causal LM: rank ``r``'s slice of one global batch drawn
from ``default_rng([seed, b])``, so DDP sees the same data as one process). So a run is
reproducible for a seed, DDP ranks see different data, and resuming only needs ``b`` — the number of train batches handed to the
model so far, counted in ``on_before_batch_transfer`` (Lightning calls it once per batch
actually used, after any prefetching) and stored by ``state_dict()`` in the checkpoint.
Keep that hook free in the LightningModule (if the module overrides it, Lightning calls the
module's instead and the count stops).

Validation uses a fixed set of examples (evenly spaced windows), the same in every run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.trainer.states import RunningStage
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from scalelab.data.config import DataConfig
from scalelab.data.shards import PreparedData
from scalelab.data.tokenizers import CharVocab

IGNORE = -100
VAL_MASK_SEED = 20_181_011  # BERT's arXiv date: any constant works, it just never changes
Batch = dict[str, torch.Tensor]


def _rank_world(trainer: Any) -> tuple[int, int]:
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


# Batches are made in runs, back to back: made one at a time between training steps, numpy's
# seeding and window indexing run from cold caches, several times slower.
RUN_BATCHES = 64
RUN_BYTES = 8 << 20  # and at most this much made ahead (GPT-2's 32 x 1025 tokens: 0.26 MB a batch)


def _nbytes(batch: Batch) -> int:
    return sum(int(v.nbytes) for v in batch.values() if isinstance(v, torch.Tensor))


class _BatchStream(IterableDataset):
    """Yields ``make(start + k)`` for k in [0, n); workers take every num_workers-th batch,
    and the DataLoader interleaves them back into order. Each batch depends only on its index,
    so making a run of them ahead changes nothing that is yielded."""

    def __init__(self, make: Callable[[int], Batch], n: int, start: int = 0):
        self.make, self.n, self.start = make, n, start

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        start = self.start  # fixed for this epoch (the hook moves self.start for the next one)
        ks = range(wid, self.n, nw)
        if not ks:
            return
        first = self.make(start + ks[0])
        yield first
        run = max(1, min(RUN_BATCHES, RUN_BYTES // max(1, _nbytes(first))))
        many = getattr(self.make, "many", None)
        for i in range(1, len(ks), run):
            run_ks = [start + k for k in ks[i : i + run]]
            yield from many(run_ks) if many else [self.make(k) for k in run_ks]

    def __len__(self) -> int:
        return self.n


def _as_made(batch: Batch) -> Batch:
    """The train stream's collate: its batches come whole (a dict of tensors). DataLoader's own
    for ``batch_size=None`` (``default_convert``) copies each dict around the same tensors."""
    return batch


class _ListDataset(Dataset):
    def __init__(self, items: list[Any]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class _StreamDataModule(pl.LightningDataModule):
    """Shared: the resumable train stream, rank handling, state_dict."""

    def __init__(self, batch_size: int, seed: int, num_workers: int, epoch_batches: int | None):
        super().__init__()
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        self.batch_size, self.seed, self.num_workers = int(batch_size), int(seed), int(num_workers)
        self.epoch_batches = epoch_batches
        self.consumed = 0  # train batches handed to the model so far (this rank)
        self._train_ds: _BatchStream | None = None
        self.pinned = 0  # > 0: every epoch replays the first `pinned` batches (overfit debugging)

    def pin_batches(self, n: int) -> None:
        """Train on the same first ``n`` batches forever (``trainer.overfit_batches=n``).

        Lightning's overfit_batches only shortens the epoch; this stream would still hand out
        new batches each epoch, so the loss could never reach ~0.
        """
        self.pinned = max(0, int(n))

    # subclasses: the batch maker for (rank) and the default epoch length for (world)
    def _train_maker(self, rank: int) -> Callable[[int], Batch]:
        raise NotImplementedError

    def _default_epoch_batches(self, world: int) -> int:
        raise NotImplementedError

    def train_dataloader(self) -> Iterable[Batch]:
        rank, world = _rank_world(self.trainer)
        n = self.epoch_batches or self._default_epoch_batches(world)
        if self.pinned:
            self._train_ds = _BatchStream(self._train_maker(rank), self.pinned, 0)
        else:
            self._train_ds = _BatchStream(self._train_maker(rank), max(1, int(n)), self.consumed)
        if not self.num_workers:
            # The stream itself: without workers a DataLoader only passes each batch on.
            return self._train_ds
        return DataLoader(
            self._train_ds,
            batch_size=None,
            collate_fn=_as_made,
            num_workers=self.num_workers,
            persistent_workers=False,  # workers must pick up the new start each epoch
        )

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        # the stage itself: trainer.training compares it as a string, a dozen calls a batch
        if trainer is None or trainer.state.stage is RunningStage.TRAINING:
            self.consumed += 1
            if self._train_ds is not None and not self.pinned:
                self._train_ds.start = self.consumed  # the next epoch continues from here
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed or state.get("batch_size") != self.batch_size:
            warnings.warn(
                f"resuming data with seed/batch_size {self.seed}/{self.batch_size} but the "
                f"checkpoint used {state.get('seed')}/{state.get('batch_size')}: the data "
                f"order will differ from the original run",
                stacklevel=2,
            )
        self.consumed = int(state["consumed"])
        if self._train_ds is not None:
            self._train_ds.start = self.consumed

    def _val_loader(self, items: list[Any], collate: Callable[[list[Any]], Batch]) -> DataLoader:
        return DataLoader(
            _ListDataset(items),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=collate,
            num_workers=self.num_workers,
        )


# --- causal LM ---------------------------------------------------------------------------


class _Windows:
    """Picklable reader of windows ``[i, i + length)`` of a shard (memmap opened lazily)."""

    def __init__(self, path: Path, dtype: str, length: int):
        self.path, self.dtype, self.length = str(path), dtype, length
        self._data: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_data": None}

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            # a plain array over the map: np.memmap's Python __getitem__ and __array_finalize__
            # ran on every take
            self._data = np.memmap(self.path, dtype=self.dtype, mode="r").view(np.ndarray)
        return self._data

    def __len__(self) -> int:
        return len(self.data)

    def take(self, starts: np.ndarray) -> torch.Tensor:
        idx = starts[:, None] + np.arange(self.length)[None, :]
        return torch.from_numpy(self.data[idx].astype(np.int64))


class _CausalMaker:
    def __init__(self, windows: _Windows, batch_size: int, seed: int, rank: int, world: int = 1):
        self.w, self.bs, self.seed, self.rank, self.world = windows, batch_size, seed, rank, world

    def _starts(self, b: int) -> np.ndarray:
        # Every rank draws the same global batch b (world x batch_size windows) and keeps rows
        # [rank*bs, (rank+1)*bs): N ranks with micro-batch m train on exactly the data one
        # process with micro-batch N*m sees, so DDP reproduces a 1-process run (scale-out tests).
        rng = np.random.default_rng([self.seed, b])
        starts = rng.integers(0, len(self.w) - self.w.length + 1, self.bs * self.world)
        return starts[self.rank * self.bs : (self.rank + 1) * self.bs]

    def __call__(self, b: int) -> Batch:
        return self.many([b])[0]

    def many(self, bs: Sequence[int]) -> list[Batch]:
        """Batches ``bs``, with one gather for all of their windows."""
        x = self.w.take(np.concatenate([self._starts(b) for b in bs])).view(len(bs), self.bs, -1)
        return [{"input_ids": xb[:, :-1], "labels": xb[:, 1:]} for xb in x]


def _even_starts(n_tokens: int, length: int, count: int) -> np.ndarray:
    return np.linspace(0, n_tokens - length, num=count).astype(np.int64)


class CausalLMDataModule(_StreamDataModule):
    """Random windows of ``block_size + 1`` tokens; batch = {input_ids, labels} Long[B, T]."""

    def __init__(
        self,
        prepared: PreparedData,
        block_size: int,
        batch_size: int,
        seed: int = 1337,
        val_batches: int = 20,
        num_workers: int = 0,
        epoch_batches: int | None = None,
    ):
        super().__init__(batch_size, seed, num_workers, epoch_batches)
        self.prepared, self.block_size, self.val_batches = (
            prepared,
            int(block_size),
            int(val_batches),
        )
        self.n_train = prepared.split_tokens("train", self.block_size, shifted=True)
        self.n_val = prepared.split_tokens("val", self.block_size, shifted=True)
        self.vocab_size = prepared.vocab_size

    def _train_maker(self, rank: int) -> _CausalMaker:
        w = _Windows(self.prepared.train_path, self.prepared.meta["dtype"], self.block_size + 1)
        return _CausalMaker(w, self.batch_size, self.seed, rank, _rank_world(self.trainer)[1])

    def _default_epoch_batches(self, world: int) -> int:
        # one "epoch" = as many tokens as the train split holds
        return max(1, self.n_train // (self.batch_size * self.block_size * world))

    def val_windows(self) -> torch.Tensor:
        """The fixed validation windows, Long[val_batches * batch_size, block_size + 1]."""
        w = _Windows(self.prepared.val_path, self.prepared.meta["dtype"], self.block_size + 1)
        return w.take(
            _even_starts(self.n_val, self.block_size + 1, self.val_batches * self.batch_size)
        )

    def val_dataloader(self) -> DataLoader:
        def collate(rows: list[torch.Tensor]) -> Batch:
            x = torch.stack(rows)
            return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

        return self._val_loader(list(self.val_windows()), collate)


# --- masked LM ---------------------------------------------------------------------------


def mask_tokens(
    x: torch.Tensor,
    rng: np.random.Generator,
    mask_prob: float,
    mask_id: int,
    n_random: int,
    special_ids: list[int] | None = None,
) -> Batch:
    """BERT masking: select ``mask_prob`` of the tokens; of those 80 % -> mask, 10 % -> a
    random ordinary token, 10 % unchanged. labels = original id at selected positions, -100
    elsewhere. Special tokens (e.g. the eot separator) are never selected.

    No ``attention_mask``: windows have no padding, and an all-True one would cost the encoder an
    additive [B, 1, T, T] mask and SDPA's masked kernel in every layer."""
    shape = tuple(x.shape)
    sel = rng.random(shape) < mask_prob
    if special_ids:
        sel &= ~np.isin(x.numpy(), special_ids)
    action = rng.random(shape)
    rand_tok = rng.integers(0, n_random, shape)
    selected = torch.from_numpy(sel)
    labels = torch.where(selected, x, torch.full_like(x, IGNORE))
    inp = x.clone()
    inp[torch.from_numpy(sel & (action < 0.8))] = mask_id
    rnd = torch.from_numpy(sel & (action >= 0.8) & (action < 0.9))
    inp[rnd] = torch.from_numpy(rand_tok)[rnd]
    return {"input_ids": inp, "labels": labels}


class _MLMMaker:
    def __init__(
        self, windows: _Windows, batch_size: int, seed: int, rank: int, kw: dict[str, Any]
    ):
        self.w, self.bs, self.seed, self.rank, self.kw = windows, batch_size, seed, rank, kw

    def __call__(self, b: int) -> Batch:
        rng = np.random.default_rng([self.seed, self.rank, b])
        x = self.w.take(rng.integers(0, len(self.w) - self.w.length + 1, self.bs))
        return mask_tokens(x, rng, **self.kw)


class MaskedLMDataModule(_StreamDataModule):
    """Windows of ``block_size`` tokens with BERT masking;
    batch = {input_ids Long, labels Long with -100 on non-selected positions} (no padding, so
    no attention_mask)."""

    def __init__(
        self,
        prepared: PreparedData,
        block_size: int,
        batch_size: int,
        seed: int = 1337,
        mask_prob: float = 0.15,
        val_batches: int = 20,
        num_workers: int = 0,
        epoch_batches: int | None = None,
    ):
        super().__init__(batch_size, seed, num_workers, epoch_batches)
        if not 0.0 < float(mask_prob) < 1.0:
            raise ValueError(
                f"mask_prob={mask_prob!r} must be strictly between 0 and 1 (BERT: 0.15)"
            )
        self.prepared, self.block_size, self.val_batches = (
            prepared,
            int(block_size),
            int(val_batches),
        )
        self.n_train = prepared.split_tokens("train", self.block_size, shifted=False)
        self.n_val = prepared.split_tokens("val", self.block_size, shifted=False)
        self.vocab_size = prepared.vocab_size
        tok = prepared.tokenizer
        self.mask_kw = {
            "mask_prob": float(mask_prob),
            "mask_id": tok.mask_id,
            "n_random": tok.n_base,
            "special_ids": tok.special_ids,
        }

    def _windows(self, split: str) -> _Windows:
        return _Windows(
            self.prepared.dir / f"{split}.bin", self.prepared.meta["dtype"], self.block_size
        )

    def _train_maker(self, rank: int) -> _MLMMaker:
        return _MLMMaker(self._windows("train"), self.batch_size, self.seed, rank, self.mask_kw)

    def _default_epoch_batches(self, world: int) -> int:
        return max(1, self.n_train // (self.batch_size * self.block_size * world))

    def val_dataloader(self) -> DataLoader:
        n = self.val_batches * self.batch_size
        x = self._windows("val").take(_even_starts(self.n_val, self.block_size, n))
        # the masks are fixed too (a constant seed, not the run's), so val loss is comparable
        b = mask_tokens(x, np.random.default_rng(VAL_MASK_SEED), **self.mask_kw)
        rows = [{k: v[i] for k, v in b.items()} for i in range(n)]
        return self._val_loader(rows, lambda r: {k: torch.stack([x[k] for x in r]) for k in r[0]})


# --- seq2seq -----------------------------------------------------------------------------

def synthetic_pairs(
    task: str, n: int, min_len: int, max_len: int, rng: np.random.Generator
) -> list[tuple[str, str]]:
    """reverse: digits -> reversed; sort: digits -> sorted; add: 'a+b' -> str(a+b),
    where the lengths (in digits) are drawn uniformly from [min_len, max_len]."""
    out = []
    for _ in range(n):
        if task == "add":
            la, lb = rng.integers(min_len, max_len + 1, 2)
            a = int("".join(map(str, rng.integers(0, 10, la))))
            b = int("".join(map(str, rng.integers(0, 10, lb))))
            out.append((f"{a}+{b}", str(a + b)))
        else:
            s = "".join(map(str, rng.integers(0, 10, rng.integers(min_len, max_len + 1))))
            out.append((s, s[::-1] if task == "reverse" else "".join(sorted(s))))
    return out


def read_tsv(path: str | Path, key: str) -> list[tuple[str, str]]:
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{key}={str(p)!r} does not exist; fix the path")
    pairs = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(
                f"{p}:{i}: expected 'source<TAB>target' (one tab), got {len(parts) - 1} tab(s)"
            )
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise ValueError(f"{key}={str(p)!r} has no 'source<TAB>target' lines")
    return pairs


def collate_seq2seq(
    rows: list[tuple[list[int], list[int]]], pad_id: int, bos_id: int, eos_id: int
) -> Batch:
    """src padded with pad; tgt_in = [bos] + target; labels = target + [eos], -100 on pad.
    Filled in numpy and handed to torch once, rather than with per-row torch ops."""
    B = len(rows)
    src_len = np.fromiter((len(s) for s, _ in rows), dtype=np.int64, count=B)
    tgt_len = np.fromiter((len(t) for _, t in rows), dtype=np.int64, count=B)
    S, T = int(src_len.max()), int(tgt_len.max()) + 1
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in = np.full((B, T), pad_id, dtype=np.int64)
    labels = np.full((B, T), IGNORE, dtype=np.int64)
    for i, (s, t) in enumerate(rows):
        src[i, : len(s)] = s
        tgt_in[i, 1 : len(t) + 1] = t
        labels[i, : len(t)] = t
    tgt_in[:, 0] = bos_id
    labels[np.arange(B), tgt_len] = eos_id
    return {
        "src_ids": torch.from_numpy(src),
        "src_mask": torch.from_numpy(np.arange(S) < src_len[:, None]),
        "tgt_in": torch.from_numpy(tgt_in),
        "tgt_mask": torch.from_numpy(np.arange(T) < tgt_len[:, None] + 1),
        "labels": torch.from_numpy(labels),
    }


class _Seq2SeqMaker:
    def __init__(
        self,
        examples: list[tuple[list[int], list[int]]],
        vocab: CharVocab,
        batch_size: int,
        seed: int,
        rank: int,
    ):
        self.ex, self.v, self.bs, self.seed, self.rank = examples, vocab, batch_size, seed, rank

    def __call__(self, b: int) -> Batch:
        rng = np.random.default_rng([self.seed, self.rank, b])
        rows = [self.ex[i] for i in rng.integers(0, len(self.ex), self.bs)]
        return collate_seq2seq(rows, self.v.pad_id, self.v.bos_id, self.v.eos_id)


class Seq2SeqDataModule(_StreamDataModule):
    """Source/target pairs: synthetic tasks (data.name=synthetic_seq2seq) or a TSV file
    (data.name=parallel_text). ``.tokenizer``/``.vocab_size``/``.pad_id``/``.bos_id``/``.eos_id``
    describe the char vocabulary (pad=0, bos=1, eos=2, unk=3, then the characters)."""

    def __init__(
        self,
        data_cfg: DataConfig,
        batch_size: int,
        seed: int | None = None,
        num_workers: int = 0,
        epoch_batches: int | None = None,
    ):
        if not data_cfg.is_seq2seq:
            raise ValueError(
                f"data.name={data_cfg.name} is not a seq2seq source; use data=synthetic_seq2seq "
                f"or data=parallel_text"
            )
        super().__init__(
            batch_size, data_cfg.seed if seed is None else seed, num_workers, epoch_batches
        )
        self.data_cfg = data_cfg
        if data_cfg.name == "synthetic_seq2seq":
            rng = np.random.default_rng(int(data_cfg.seed))
            train = synthetic_pairs(
                data_cfg.task, int(data_cfg.n_train), data_cfg.min_len, data_cfg.max_len, rng
            )
            val = synthetic_pairs(
                data_cfg.task, int(data_cfg.n_val), data_cfg.min_len, data_cfg.max_len, rng
            )
            chars = "0123456789+"
        else:
            train = read_tsv(data_cfg.path or "", "data.path")
            if data_cfg.val_path:
                val = read_tsv(data_cfg.val_path, "data.val_path")
            else:  # tail split, like the text corpora
                n_val = max(1, int(len(train) * float(data_cfg.val_fraction)))
                if len(train) - n_val < 1:
                    raise ValueError(
                        f"data.path={data_cfg.path!r} has {len(train)} pair(s): too few for a "
                        f"train and a val split; add pairs or give data.val_path"
                    )
                train, val = train[:-n_val], train[-n_val:]
            chars = "".join(s + t for s, t in train + val)
        self.vocab = self.tokenizer = CharVocab(chars)
        self.vocab_size = self.vocab.vocab_size
        self.pad_id, self.bos_id, self.eos_id = (
            self.vocab.pad_id,
            self.vocab.bos_id,
            self.vocab.eos_id,
        )
        enc = self.vocab.encode
        self.train_pairs, self.val_pairs = train, val
        self.train_examples = [(enc(s), enc(t)) for s, t in train]
        self.val_examples = [(enc(s), enc(t)) for s, t in val]

    def _train_maker(self, rank: int) -> _Seq2SeqMaker:
        return _Seq2SeqMaker(self.train_examples, self.vocab, self.batch_size, self.seed, rank)

    def _default_epoch_batches(self, world: int) -> int:
        return math.ceil(len(self.train_examples) / (self.batch_size * world))

    def val_dataloader(self) -> DataLoader:
        v = self.vocab
        return self._val_loader(
            self.val_examples, lambda r: collate_seq2seq(r, v.pad_id, v.bos_id, v.eos_id)
        )
