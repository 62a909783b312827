"""DataModules: determinism, resume, DDP slices, fixed validation, MLM statistics, seq2seq."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from scalelab.data import (
    CausalLMDataModule,
    DataConfig,
    MaskedLMDataModule,
    Seq2SeqDataModule,
    TokenizerConfig,
    prepare,
)

from .conftest import write


def _take(dm, n):
    it = iter(dm.train_dataloader())
    out = []
    for _ in range(n):
        b = next(it)
        dm.on_before_batch_transfer(b, 0)  # what Lightning does for every batch it uses
        out.append(b)
    return out


def test_causal_batches_are_shifted_windows(shakespeare_char):
    dm = CausalLMDataModule(shakespeare_char, block_size=16, batch_size=4, seed=1)
    b = _take(dm, 1)[0]
    assert b["input_ids"].shape == (4, 16) and b["input_ids"].dtype == torch.long
    assert torch.equal(b["input_ids"][:, 1:], b["labels"][:, :-1])
    train = np.asarray(shakespeare_char.tokens("train"))
    row = b["input_ids"][0].numpy()
    # every row is a real window of train.bin
    starts = np.flatnonzero(
        np.all(np.lib.stride_tricks.sliding_window_view(train, 16) == row, axis=1)
    )
    assert len(starts) >= 1


def test_causal_deterministic_for_a_seed(shakespeare_char):
    a = _take(CausalLMDataModule(shakespeare_char, 16, 4, seed=7), 3)
    b = _take(CausalLMDataModule(shakespeare_char, 16, 4, seed=7), 3)
    c = _take(CausalLMDataModule(shakespeare_char, 16, 4, seed=8), 3)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0]["input_ids"], c[0]["input_ids"])


@pytest.mark.parametrize("cls", [CausalLMDataModule, MaskedLMDataModule])
def test_resume_continues_exactly(shakespeare_char, cls):
    ref = cls(shakespeare_char, 16, 4, seed=3)
    batches = _take(ref, 6)
    first = cls(shakespeare_char, 16, 4, seed=3)
    _take(first, 4)
    state = first.state_dict()
    assert state["consumed"] == 4
    resumed = cls(shakespeare_char, 16, 4, seed=3)
    resumed.load_state_dict(state)
    nxt = _take(resumed, 2)
    for got, want in zip(nxt, batches[4:], strict=True):
        for k in want:
            assert torch.equal(got[k], want[k])


def test_workers_keep_the_order(shakespeare_char):
    a = _take(CausalLMDataModule(shakespeare_char, 16, 4, seed=5), 4)
    dm = CausalLMDataModule(shakespeare_char, 16, 4, seed=5, num_workers=2)
    assert isinstance(dm.train_dataloader(), DataLoader)
    b = list(zip(range(4), dm.train_dataloader(), strict=False))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, (_, y) in zip(a, b, strict=True))


def test_without_workers_the_stream_is_iterated_itself(shakespeare_char):
    """No DataLoader between Lightning and the stream where it would only pass batches on."""
    assert not isinstance(CausalLMDataModule(shakespeare_char, 16, 4).train_dataloader(), DataLoader)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_run_of_causal_batches_is_what_one_at_a_time_makes(shakespeare_char, rank):
    """The causal maker gathers a run's windows at once: the tensors of ``maker(b)``, per rank."""
    from scalelab.data.datamodules import _CausalMaker

    windows = CausalLMDataModule(shakespeare_char, 16, 4)._train_maker(0).w
    maker = _CausalMaker(windows, 4, seed=3, rank=rank, world=2)
    bs = list(range(5, 70))
    for got, b in zip(maker.many(bs), bs, strict=True):
        want = maker(b)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_ranks_get_different_deterministic_data(shakespeare_char):
    class FakeTrainer:  # only the two attributes the DataModule reads
        world_size = 2
        training = True

        def __init__(self, rank):
            self.global_rank = rank

    out = []
    for rank in (0, 1, 0):
        dm = CausalLMDataModule(shakespeare_char, 16, 4, seed=1)
        dm.trainer = FakeTrainer(rank)
        out.append(next(iter(dm.train_dataloader()))["input_ids"])
    assert not torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


def test_validation_is_fixed(shakespeare_char):
    a = CausalLMDataModule(shakespeare_char, 32, 8, seed=1, val_batches=3)
    b = CausalLMDataModule(shakespeare_char, 32, 8, seed=99, val_batches=3)
    va, vb = list(a.val_dataloader()), list(b.val_dataloader())
    assert len(va) == 3
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(va, vb, strict=True))
    assert torch.equal(
        va[0]["input_ids"][0],
        torch.from_numpy(shakespeare_char.tokens("val")[:32].astype(np.int64)),
    )


def test_block_size_too_large(tmp_path):
    f = write(tmp_path / "t.txt", "hello world, " * 20)
    p = prepare(
        DataConfig(name="text_files", paths=[str(f)]),
        TokenizerConfig(name="char"),
        tmp_path / "c",
        progress=False,
    )
    with pytest.raises(ValueError, match=r"val\.bin has \d+ tokens.*block_size=128"):
        CausalLMDataModule(p, block_size=128, batch_size=2)
    with pytest.raises(ValueError, match="block_size=512"):
        MaskedLMDataModule(p, block_size=512, batch_size=2)


def test_mlm_proportions(shakespeare_char):
    dm = MaskedLMDataModule(shakespeare_char, block_size=128, batch_size=64, seed=0)
    tok = shakespeare_char.tokenizer
    sel = masked = rand = kept = total = 0
    it = iter(dm.train_dataloader())
    maker = dm._train_maker(0)
    for k in range(10):
        b = next(it)
        # the same windows, unmasked: batch k draws its starts first from rng(seed, rank, k)
        rng = np.random.default_rng([maker.seed, maker.rank, k])
        original = maker.w.take(rng.integers(0, len(maker.w) - maker.w.length + 1, maker.bs))
        assert set(b) == {"input_ids", "labels"}  # no padding, so no attention mask to apply
        x, y = b["input_ids"], b["labels"]
        s = y != -100
        total += y.numel()
        sel += s.sum().item()
        masked += (x[s] == tok.mask_id).sum().item()
        kept += (x[s] == y[s]).sum().item()
        rand += ((x[s] != y[s]) & (x[s] != tok.mask_id)).sum().item()
        assert torch.equal(x[~s], original[~s])  # unselected positions untouched
        assert torch.equal(y[s], original[s])  # labels are the original tokens
        assert (x < tok.vocab_size).all()
    n = total
    # 81920 tokens: 3-sigma bands
    assert abs(sel / n - 0.15) < 3 * np.sqrt(0.15 * 0.85 / n)
    assert abs(masked / sel - 0.8) < 3 * np.sqrt(0.8 * 0.2 / sel)
    # "random" can hit the original token (1/65), so kept is a bit above 10 %
    assert abs(rand / sel - 0.1 * 64 / 65) < 3 * np.sqrt(0.1 * 0.9 / sel) + 0.002
    assert abs(kept / sel - (0.1 + 0.1 / 65)) < 3 * np.sqrt(0.1 * 0.9 / sel) + 0.002


def test_mlm_only_changes_selected_and_val_fixed(shakespeare_char):
    dm = MaskedLMDataModule(shakespeare_char, block_size=32, batch_size=8, seed=0, val_batches=2)
    w = dm._windows("train")
    b = dm._train_maker(0)(0)
    rng = np.random.default_rng([0, 0, 0])
    orig = w.take(rng.integers(0, len(w) - 32 + 1, 8))
    s = b["labels"] != -100
    assert torch.equal(b["input_ids"][~s], orig[~s]) and torch.equal(b["labels"][s], orig[s])
    v1 = list(dm.val_dataloader())
    v2 = list(MaskedLMDataModule(shakespeare_char, 32, 8, seed=5, val_batches=2).val_dataloader())
    assert all(torch.equal(a["input_ids"], c["input_ids"]) for a, c in zip(v1, v2, strict=True))


@pytest.mark.parametrize("task", ["reverse", "sort", "add"])
def test_seq2seq_synthetic(task):
    cfg = DataConfig(
        name="synthetic_seq2seq", task=task, n_train=200, n_val=20, min_len=2, max_len=6, seed=3
    )
    dm = Seq2SeqDataModule(cfg, batch_size=8)
    v = dm.vocab
    for src, tgt in dm.train_pairs[:50]:
        if task == "reverse":
            assert tgt == src[::-1]
        elif task == "sort":
            assert tgt == "".join(sorted(src))
        else:
            a, b = src.split("+")
            assert int(tgt) == int(a) + int(b) and 2 <= len(a) <= 6
    b = next(iter(dm.train_dataloader()))
    assert set(b) == {"src_ids", "src_mask", "tgt_in", "tgt_mask", "labels"}
    for i in range(8):
        n_src = int(b["src_mask"][i].sum())
        assert (b["src_ids"][i, n_src:] == v.pad_id).all()
        t = int(b["tgt_mask"][i].sum())
        assert b["tgt_in"][i, 0] == v.bos_id
        assert b["labels"][i, t - 1] == v.eos_id
        assert torch.equal(b["tgt_in"][i, 1:t], b["labels"][i, : t - 1])  # teacher forcing shift
        assert (b["labels"][i, t:] == -100).all() and (b["tgt_in"][i, t:] == v.pad_id).all()
        src = v.decode(b["src_ids"][i, :n_src].tolist())
        tgt = v.decode(b["labels"][i, : t - 1].tolist())
        assert (src, tgt) in set(dm.train_pairs)
    again = Seq2SeqDataModule(cfg, batch_size=8)
    assert again.train_pairs == dm.train_pairs and again.val_pairs == dm.val_pairs
    assert len(list(dm.val_dataloader())) == 3


def test_seq2seq_parallel_tsv(tmp_path):
    f = write(tmp_path / "pairs.tsv", "".join(f"hello {i}\tbonjour {i}\n" for i in range(30)))
    dm = Seq2SeqDataModule(
        DataConfig(name="parallel_text", path=str(f), val_fraction=0.1), batch_size=4
    )
    assert len(dm.train_pairs) == 27 and dm.val_pairs[0] == ("hello 27", "bonjour 27")
    b = next(iter(dm.val_dataloader()))
    assert dm.vocab.decode(b["src_ids"][0][b["src_mask"][0]].tolist()) == "hello 27"
    bad = write(tmp_path / "bad.tsv", "no tab here\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:1: expected 'source<TAB>target'"):
        Seq2SeqDataModule(DataConfig(name="parallel_text", path=str(bad)), batch_size=4)
    with pytest.raises(FileNotFoundError, match=r"data\.path="):
        Seq2SeqDataModule(
            DataConfig(name="parallel_text", path=str(tmp_path / "x.tsv")), batch_size=4
        )


@pytest.mark.parametrize(("run_bytes", "run"), [(8 << 20, 64), (3 * 80, 3)])
def test_the_stream_makes_runs_ahead_and_yields_what_one_at_a_time_would(monkeypatch, run_bytes, run):
    """Batches are made in runs (warm caches); what comes out, and in which order, is the
    one-at-a-time stream's. A run is at most RUN_BATCHES batches and RUN_BYTES bytes."""
    from scalelab.data import datamodules as D

    monkeypatch.setattr(D, "RUN_BYTES", run_bytes)
    made: list[int] = []

    def make(b: int) -> dict[str, torch.Tensor]:
        made.append(b)
        return {"input_ids": torch.full((2, 5), b, dtype=torch.int64)}  # 80 bytes

    stream = D._BatchStream(make, n=150, start=7)
    got, ahead = [], []
    for batch in stream:
        got.append(int(batch["input_ids"][0, 0]))
        ahead.append(len(made) - len(got))
    assert got == list(range(7, 157)) and made == got
    # the first batch alone (its size sets the run), then each run made at its first batch
    assert ahead[0] == 0 and ahead[1] == run - 1 and max(ahead) == run - 1
