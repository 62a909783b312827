"""Training core: LightningModules per objective, AdamW groups, lr schedules, throughput/MFU.

Pure PyTorch Lightning: no Hydra, no MLflow here (the CLI and tracking layers sit above).

    from scalelab.training import CausalLM, OptimConfig, ThroughputMonitor, derive_batch
    module = CausalLM(model_cfg, OptimConfig(lr=1e-3), total_steps=2000,
                      bytes_per_token=prepared.bytes_per_token, tokenizer=prepared.tokenizer)
"""

from typing import Any

# name -> submodule. Loaded on first use (PEP 562), so that `scalelab.training.config` or
# `.batch` (what config validation needs) do not pull in Lightning through this package.
_EXPORTS = {
    "BatchPlan": "batch", "derive_batch": "batch", "steps_from_budget": "batch",
    "TextSampler": "callbacks", "ThroughputMonitor": "callbacks",
    "OptimConfig": "config",
    "CausalLM": "modules", "LMModule": "modules", "MaskedLM": "modules", "Seq2Seq": "modules",
    "bits_per_byte": "metrics", "module_class": "modules",
    "build_optimizer": "optim", "param_groups": "optim",
    "peak_flops": "perf",
    "build_lr_lambda": "schedules",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"scalelab.training.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'scalelab.training' has no attribute {name!r}")


__all__ = [
    "BatchPlan",
    "CausalLM",
    "LMModule",
    "MaskedLM",
    "OptimConfig",
    "Seq2Seq",
    "TextSampler",
    "ThroughputMonitor",
    "bits_per_byte",
    "build_lr_lambda",
    "build_optimizer",
    "derive_batch",
    "module_class",
    "param_groups",
    "peak_flops",
    "steps_from_budget",
]
