"""The shortcut for Lightning's per-log device walk: it skips only moves that move nothing, and
what Lightning logs and reduces stays the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pytorch_lightning.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric

from scalelab.training.lightning_fixes import skip_noop_result_moves

from .conftest import cpu_trainer
from .test_callbacks import loader, tiny_module
from .test_step_logging import ListLogger


def holder() -> _ResultMetric:
    meta = _Metadata(fx="training_step", name="x", on_step=True, on_epoch=True)
    return _ResultMetric(meta, True)


def test_a_move_to_the_device_the_holder_is_on_returns_it_untouched() -> None:
    skip_noop_result_moves()
    m = holder()
    meta, value = m.meta, m.value
    assert m.to(torch.device("cpu")) is m and m.to("cpu") is m
    assert m.meta is meta and m.value is value  # no walk: nothing copied
    # the original walks and deep-copies the metadata: what the shortcut saves on every log
    original = _ResultMetric.to.__wrapped__
    original(m, torch.device("cpu"))
    assert m.meta is not meta and m.meta == meta


def test_other_moves_still_take_the_original_path() -> None:
    skip_noop_result_moves()
    m = holder()
    m.to(torch.float64)  # a cast, not a device
    assert m.value.dtype == torch.float64
    m.to("meta")  # another device: everything moves, the reset defaults included
    assert m.value.device.type == "meta" and m.cumulated_batch_size.device.type == "meta"
    assert all(t.device.type == "meta" for t in m._defaults.values())


def test_applying_it_twice_wraps_once() -> None:
    skip_noop_result_moves()
    first = _ResultMetric.to
    skip_noop_result_moves()
    assert _ResultMetric.to is first
    assert not hasattr(first.__wrapped__, "__wrapped__")


def test_logged_step_values_and_epoch_means_are_unchanged() -> None:
    """With the shortcut on (building the module applies it), Lightning still logs each
    step's value and reduces the epoch mean weighted by batch size."""
    steps = 6
    module = tiny_module(steps)
    assert hasattr(_ResultMetric.to, "__wrapped__")
    seen: list[float] = []

    def training_step(batch: Any, batch_idx: int) -> torch.Tensor:
        loss = type(module).training_step(module, batch, batch_idx)
        value = float(batch_idx + 1)
        seen.append(value)
        module.log("probe", torch.tensor(value), on_step=True, on_epoch=True,
                   batch_size=batch_idx + 1)
        return loss

    module.training_step = training_step  # type: ignore[method-assign]
    logger = ListLogger()
    trainer = cpu_trainer(steps, logger=logger, log_every_n_steps=1, limit_val_batches=0,
                          limit_train_batches=steps)
    trainer.fit(module, loader(steps * 2, 2))
    per_step = [m["probe_step"] for _, m in logger.rows if "probe_step" in m]
    assert per_step == seen == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    weighted = sum(v * v for v in seen) / sum(seen)  # value k has batch size k
    epoch = [m["probe_epoch"] for _, m in logger.rows if "probe_epoch" in m]
    assert epoch == [pytest.approx(weighted)]
