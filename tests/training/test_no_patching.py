"""Importing scalelab and training with it leaves Lightning and torch as they were.

A fresh process snapshots every module of ``torch``, ``pytorch_lightning`` and
``lightning_fabric`` that is loaded, and every class they define (``vars()`` of each, by
identity), then imports scalelab, runs a real ``Trainer.fit`` of a tiny CausalLM with the
platform's callbacks, and compares: an attribute replaced or deleted is a patch. Modules that
scalelab or the fit load later are not compared (they were not there to be patched before).

torch keeps a little state of its own in such attributes (hook handle ids, the profiler's
lazy checks), so a plain Lightning fit with no scalelab code runs first, and what it changes
by itself is left out of the comparison.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import sys
    import pytorch_lightning as pl
    import lightning_fabric
    import torch
    import torch.nn
    import torch.optim
    import torch.utils.data

    PREFIXES = ("torch", "pytorch_lightning", "lightning_fabric")

    def snapshot():
        seen = {}
        for name, mod in list(sys.modules.items()):
            if mod is None or not name.split(".")[0] in PREFIXES:
                continue
            try:
                attrs = dict(vars(mod))
            except TypeError:
                continue
            seen[(name, "")] = attrs
            for value in attrs.values():
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    seen[(name, value.__qualname__)] = dict(vars(value))
        return seen

    def changes(old, new):
        out = set()
        for key, attrs in old.items():
            now = new.get(key, {})
            for attr, value in attrs.items():
                if attr not in now or now[attr] is not value:
                    out.add(f"{key[0]}{'.' + key[1] if key[1] else ''}.{attr}")
        return out

    class Plain(pl.LightningModule):  # no scalelab code: what Lightning and torch change alone
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.net.register_forward_hook(lambda *args: None)  # torch counts hook handles

        def training_step(self, batch, batch_idx):
            self.log("loss", batch.sum() * 0 + self.net(batch).pow(2).mean(), prog_bar=True)
            return self.net(batch).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("val", self.net(batch).mean())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), fused=True)

    data = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    first = snapshot()
    pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
               enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=2,
               limit_val_batches=1, val_check_interval=2, gradient_clip_val=1.0,
               enable_progress_bar=False).fit(Plain(), data, data)
    before = snapshot()
    own = changes(first, before)
    if "--patch" in sys.argv:  # a deliberate patch: the check must report it
        step = torch.optim.AdamW.step
        torch.optim.AdamW.step = lambda self, closure=None: step(self, closure)

    from pathlib import Path
    from scalelab.cli.callbacks import RunRecorder
    from scalelab.cli.progress import LineProgress
    from scalelab.model import ModelConfig
    from scalelab.training import CausalLM, OptimConfig, ThroughputMonitor

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, max_seq_len=8, d_model=16, n_layers=1, n_heads=2)
    module = CausalLM(cfg, OptimConfig(lr=1e-2, warmup_steps=1), total_steps=4)
    x = torch.randint(0, 32, (32, 9))
    rows = [{"input_ids": r[:-1], "labels": r[1:]} for r in x]
    loader = torch.utils.data.DataLoader(rows, batch_size=4)
    out = Path(sys.argv[1])
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, log_every_n_steps=2, limit_val_batches=1,
                         val_check_interval=2, default_root_dir=str(out),
                         callbacks=[RunRecorder({}, out, []), ThroughputMonitor(), LineProgress(every=2)])
    trainer.fit(module, loader, loader)
    assert trainer.global_step == 4

    changed = changes(before, snapshot()) - own
    print("COMPARED", sum(len(a) for a in before.values()))
    print("CHANGED", " ".join(sorted(changed)) or "-")
''')


def _run(tmp_path, *args: str) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if ln.startswith(("COMPARED", "CHANGED")))
    changed = [] if lines["CHANGED"] == "-" else lines["CHANGED"].split()
    return int(lines["COMPARED"]), changed


def test_training_patches_nothing_in_lightning_or_torch(tmp_path) -> None:
    compared, changed = _run(tmp_path)
    assert compared > 10_000  # the walk saw Lightning's and torch's modules and classes
    assert changed == []


@pytest.mark.slow
def test_the_check_reports_a_patch(tmp_path) -> None:
    _, changed = _run(tmp_path, "--patch")
    assert changed == ["torch.optim.adamw.AdamW.step"]
