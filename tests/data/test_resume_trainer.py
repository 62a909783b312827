"""Resume through a real Lightning checkpoint: the data position continues exactly."""

import pytest
import pytorch_lightning as pl
import torch

from scalelab.data import CausalLMDataModule


class Recorder(pl.LightningModule):
    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.out = torch.nn.Linear(8, vocab)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, _):
        self.seen.append(batch["input_ids"].clone())
        logits = self.out(self.emb(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def validation_step(self, batch, _):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(prepared, steps, root, ckpt=None, model=None):
    dm = CausalLMDataModule(
        prepared, block_size=8, batch_size=2, seed=11, epoch_batches=4, val_batches=1
    )
    model = model or Recorder(prepared.vocab_size)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        limit_val_batches=1,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return trainer, model


@pytest.mark.slow
def test_resume_from_checkpoint_continues_the_stream(shakespeare_char, tmp_path):
    # 6 steps crosses an epoch boundary (epoch_batches=4): the stream continues across epochs
    _, full = _fit(shakespeare_char, 6, tmp_path / "a")
    trainer, _ = _fit(shakespeare_char, 3, tmp_path / "b")
    ckpt = tmp_path / "b.ckpt"
    trainer.save_checkpoint(ckpt)
    _, resumed = _fit(shakespeare_char, 6, tmp_path / "c", ckpt=str(ckpt))
    assert len(full.seen) == 6 and len(resumed.seen) == 3
    for got, want in zip(resumed.seen, full.seen[3:], strict=True):
        assert torch.equal(got, want)
    # and no batch repeats within the uninterrupted run
    assert len({tuple(x.flatten().tolist()) for x in full.seen}) == 6
