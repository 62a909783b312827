"""The start banner and the plain-text progress lines of `scalelab-train`.

Both go through ``logging`` (logger ``scalelab.train``), so they reach the console and the run
folder's ``train.log`` (Hydra's job logging, conf/hydra/default.yaml).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.tracking.redact import redact

if TYPE_CHECKING:
    from scalelab.data.bundle import DataBundle

log = logging.getLogger("scalelab.train")
RULE = "─" * 72


def ui_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str:
    """Where the run opens in the MLflow UI (`make ui` serves a local store on port 5000)."""
    base = tracking_uri if tracking_uri and tracking_uri.startswith("http") else "http://127.0.0.1:5000"
    # workflowType: MLflow 3.17 would open the run in GenAI mode without it
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
    return url if base != "http://127.0.0.1:5000" else f"{url}  (after `make ui`)"


def start_lines(run_name: str, out_dir: Path, tracker: Any, model_cfg: Any, spec: Any,
                data: DataBundle, resumed_from: Path | None,
                lr_segments: list[tuple[int, int]] | None = None) -> list[str]:
    from scalelab.cli.resume_compare import schedule_line

    n = model_cfg.n_params()
    fpt = model_cfg.flops_per_token(training=True, attention=True, seq_len=spec.block_size)
    steps = planned_steps(spec)
    tokens = steps * spec.batch.tokens_per_step
    source = spec.data.name + (f" ({data.source})" if data.source else "")
    lines = [
        RULE,
        f"scalelab-train  {run_name}" + (f"  (resuming from {resumed_from})" if resumed_from else ""),
        RULE,
        f"run folder    : {out_dir}",
    ]
    if tracker.run_id:
        lines.append(f"MLflow run    : {tracker.run_id}  ({redact(tracker.tracking_uri)})")
        lines.append(f"MLflow UI     : {redact(ui_url(tracker.tracking_uri, tracker.experiment_id, tracker.run_id))}")
    lines += [
        f"model         : {model_cfg.arch}, {model_cfg.n_layers} layers, d={model_cfg.d_model}: "
        f"N={n:,} parameters, {fpt:,} FLOPs/token (training)",
        f"tokens planned: {tokens:,} ({steps:,} steps x {spec.batch.tokens_per_step:,} "
        f"tokens, {tokens * fpt:.3g} FLOPs)",
        f"data          : {source}, tokenizer {spec.tokenizer.name}, vocab {data.vocab_size:,}",
        *([f"init from     : {spec.init_from} (its config.json sets the model's shape; "
           f"block size {spec.block_size} of its {model_cfg.max_seq_len} positions)"]
          if spec.init_from else []),
        f"threads       : {threads_line()}",
        f"precision     : {spec.trainer.precision}"
        + (f" (auto: {spec.precision_auto})" if spec.precision_auto else ""),
        f"lr schedule   : {schedule_line(spec, lr_segments or [(0, spec.max_steps)])}",
    ]
    from scalelab.training.devices import uses_gpu

    hint = vocab_alignment_hint(model_cfg.vocab_size, uses_gpu(str(spec.trainer.accelerator)))
    return [*lines, *([f"hint          : {hint}"] if hint else []), RULE]


def planned_steps(spec: Any) -> int:
    """The optimizer steps that will run: Lightning's fast_dev_run (true = 1) caps the run."""
    fast = spec.trainer.fast_dev_run
    if fast is True or (isinstance(fast, int) and not isinstance(fast, bool) and fast > 0):
        return min(spec.max_steps, 1 if fast is True else int(fast))
    return spec.max_steps


def vocab_alignment_hint(vocab_size: int, on_gpu: bool) -> str | None:
    """On a GPU, an output layer whose row count is not a multiple of 64 misses the tensor
    cores' aligned kernels (GPT-2's 50,260 -> 50,304 made a step 1.14x faster on an H200)."""
    if not on_gpu or vocab_size % 64 == 0:
        return None
    padded = -(-vocab_size // 128) * 128
    return (f"vocab {vocab_size:,} is not a multiple of 64; model.vocab_size={padded} (padding "
            f"rows no token uses) runs the output layer faster on a GPU (docs/performance.md)")


def threads_line() -> str:
    """The thread count the run took and where it came from, so a slow run explains itself."""
    import torch

    from scalelab.runtime import available_cores, concurrent_processes

    n = torch.get_num_threads()
    return (f"{n} torch threads ({available_cores()} cores, "
            f"{concurrent_processes()} scalelab process(es) sharing them)")


def print_start(*args: Any, **kwargs: Any) -> None:
    log.info("\n".join(start_lines(*args, **kwargs)))


class _LineLogger(io.TextIOBase):
    """A text stream that logs each complete line (INFO) instead of writing it."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger, self.buf = logger, ""

    def write(self, s: str) -> int:
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self.logger.info(line)
        return len(s)

    def flush(self) -> None:
        if self.buf:
            self.logger.info(self.buf)
            self.buf = ""


@contextlib.contextmanager
def stdout_to_log(logger_name: str = "scalelab.data") -> Iterator[None]:
    """Under Hydra (job logging configured), what the block prints goes through ``logging``:
    still on the console, and also into train.log. Without Hydra, prints stay prints."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        yield
        return
    stream = _LineLogger(logging.getLogger(logger_name))
    with contextlib.redirect_stdout(stream):
        try:
            yield
        finally:
            stream.flush()
