"""Training core: LightningModules per objective, AdamW groups, lr schedules, throughput/MFU.

Pure PyTorch Lightning: no Hydra, no MLflow here (the CLI and tracking layers sit above).

    from scalelab.training import CausalLM, OptimConfig, ThroughputMonitor, derive_batch
    module = CausalLM(model_cfg, OptimConfig(lr=1e-3), total_steps=2000,
                      bytes_per_token=prepared.bytes_per_token, tokenizer=prepared.tokenizer)

The names load lazily: ``scalelab.training.schedules`` or ``.perf`` (plain Python, used by the
sweep planner) must not pull in torch and Lightning through this file.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "BatchPlan": "batch",
    "derive_batch": "batch",
    "steps_from_budget": "batch",
    "TextSampler": "callbacks",
    "ThroughputMonitor": "callbacks",
    "OptimConfig": "config",
    "CausalLM": "modules",
    "LMModule": "modules",
    "MaskedLM": "modules",
    "Seq2Seq": "modules",
    "bits_per_byte": "modules",
    "module_class": "modules",
    "build_optimizer": "optim",
    "param_groups": "optim",
    "peak_flops": "perf",
    "build_lr_lambda": "schedules",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'scalelab.training' has no attribute {name!r}")
    return getattr(import_module(f"scalelab.training.{_WHERE[name]}"), name)
