"""Callbacks: throughput / MFU, and text samples."""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch

from scalelab.training.perf import mfu, peak_flops


def _process_start() -> float:
    """When this process started (epoch seconds): start-up cost is counted from there."""
    import psutil

    return float(psutil.Process().create_time())


# Logged without a prefix: MLflow's run page sorts prefixed sections (train/, val/) first and
# puts unprefixed keys after them, so the loss curves open the page and tokens/s sits with lr.
THROUGHPUT_KEYS = ("tokens_per_sec", "tokens_per_sec_per_device", "flops_per_sec",
                   "flops_per_sec_per_device", "mfu", "tokens_per_cpu_sec")


def window_steps(every_n_steps: int | None, log_every_n_steps: int) -> int:
    """Optimizer steps in a throughput window: ``every_n_steps`` (default: Lightning's logging
    cadence) rounded up to a multiple of that cadence. So every window ends on a step whose
    metrics Lightning writes: a value logged on another step was written later, stale, or not
    at all, and cost its ``self.log`` calls (and on a GPU a host sync) on that step."""
    log_every = max(1, log_every_n_steps)
    return -(-(every_n_steps or log_every) // log_every) * log_every


class ThroughputMonitor(pl.Callback):
    """Logs tokens/s, model FLOP/s and MFU over windows of ``every_n_steps`` optimizer steps,
    rounded up to a multiple of ``trainer.log_every_n_steps`` (``window_steps``).

    Counts come from the module's ``tokens_seen`` / ``flops_seen`` (all devices, all
    micro-batches; FLOPs from ``ModelConfig.flops_per_token(training=True)``, the PaLM
    convention 6N + 12LTd). MFU = achieved FLOP/s / (peak FLOP/s per device x devices).
    The first step (startup, compilation) and validation time are left out of the windows.

    Metrics: tokens_per_sec (all devices),
    tokens_per_sec_per_device, flops_per_sec, flops_per_sec_per_device,
    mfu, and on CPU tokens_per_cpu_sec (per CPU-second of this process, which stays
    meaningful on a shared machine). ``summary`` holds the run averages over all measured windows, and
    time_to_first_step: seconds from process start to the end of the first step.
    """

    def __init__(self, every_n_steps: int | None = None, peak_flops_per_device: float | None = None):
        super().__init__()
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"ThroughputMonitor every_n_steps={every_n_steps!r}: must be >= 1")
        self.every_n_steps = every_n_steps
        self.peak: float | None = peak_flops_per_device
        self.world_size = 1
        self.summary: dict[str, float] = {}
        self._t0: float | None = None
        self._cpu0 = 0.0
        self._tokens0 = 0
        self._flops0 = 0.0
        self._last_step = -1
        self._window = 1
        self._total_time = 0.0
        self._total_tokens = 0
        self._total_flops = 0.0

    @staticmethod
    def _sync(pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def _start_window(self, pl_module: Any) -> None:
        self._sync(pl_module)
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._tokens0 = int(pl_module.tokens_seen)
        self._flops0 = float(pl_module.flops_seen)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not hasattr(pl_module, "tokens_seen") or not hasattr(pl_module, "flops_seen"):
            raise RuntimeError(
                "ThroughputMonitor needs a scalelab LMModule (tokens_seen / flops_seen counters)"
            )
        self.world_size = int(trainer.world_size)
        self._t0, self._last_step = None, int(trainer.global_step)
        self._window = window_steps(self.every_n_steps, int(trainer.log_every_n_steps))  # once per fit

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if step == self._last_step:  # mid gradient accumulation
            return
        self._last_step = step
        if self._t0 is None:  # the window starts after the first step of this fit
            if "time_to_first_step" not in self.summary:
                self.summary["time_to_first_step"] = time.time() - _process_start()
            if self.peak is None:  # ~0.3 s of matmuls: after the first step, outside any window
                self.peak = peak_flops(pl_module.device, trainer.precision)
            self._start_window(pl_module)
            return
        if step % self._window:
            return
        self._sync(pl_module)
        dt = time.perf_counter() - self._t0
        cpu = time.process_time() - self._cpu0
        tokens = int(pl_module.tokens_seen) - self._tokens0
        flops = float(pl_module.flops_seen) - self._flops0
        if dt <= 0 or tokens <= 0:
            return
        self._total_time += dt
        self._total_tokens += tokens
        self._total_flops += flops
        metrics = self._metrics(tokens, flops, dt)
        if pl_module.device.type == "cpu" and cpu > 0:
            # tokens per CPU-second of this process: its efficiency even when other jobs
            # share the cores (wall-clock rates then measure the neighbours as much as us)
            metrics["tokens_per_cpu_sec"] = tokens / cpu
        for k, v in metrics.items():
            # not prog_bar=True (a float per step for Lightning's bar): the bars read callback_metrics
            pl_module.log(k, v, on_step=True, on_epoch=False)
        first = self.summary.get("time_to_first_step")
        self.summary = self._metrics(self._total_tokens, self._total_flops, self._total_time)
        if first is not None:
            self.summary["time_to_first_step"] = first
        self._start_window(pl_module)

    def _metrics(self, tokens: float, flops: float, dt: float) -> dict[str, float]:
        w = self.world_size
        out = {
            "tokens_per_sec": tokens / dt,
            "tokens_per_sec_per_device": tokens / dt / w,
            "flops_per_sec": flops / dt,
            "flops_per_sec_per_device": flops / dt / w,
        }
        if self.peak:
            out["mfu"] = mfu(flops / dt / w, self.peak)
        return out

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        # validation time is not training throughput: restart the window after it
        if not trainer.sanity_checking and self._t0 is not None:
            self._start_window(pl_module)


class TextSampler(pl.Callback):
    """A text sample at each validation end (decoders, rank 0) with its own prompt/settings.

    The modules already sample when ``sample_every_val=True``; use this callback instead (with
    ``sample_every_val=False``) to choose a different prompt, length or temperature. It sets
    ``pl_module.last_sample`` (str) and appends ``(global_step, text)`` to
    ``pl_module.samples``; it prints nothing.
    """

    def __init__(
        self,
        prompt: str | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = -1,
        seed: int = 1234,
    ):
        super().__init__()
        self.prompt, self.max_new_tokens = prompt, max_new_tokens
        self.temperature, self.top_k, self.seed = temperature, top_k, seed

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if getattr(pl_module, "tokenizer", None) is None or getattr(pl_module, "arch", "") != "decoder":
            return
        if getattr(pl_module, "weights_sharded", lambda: False)():  # FSDP: rank 0 cannot run it
            return
        text = pl_module.sample(
            self.prompt, self.max_new_tokens, self.temperature, self.top_k, seed=self.seed
        )
        pl_module.last_sample = text
        pl_module.samples.append((int(trainer.global_step), text))
