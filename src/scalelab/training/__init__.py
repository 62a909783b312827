"""Training core: LightningModules per objective, AdamW groups, lr schedules, throughput/MFU.

Pure PyTorch Lightning: no Hydra, no MLflow here (the CLI and tracking layers sit above).

    from scalelab.training import CausalLM, OptimConfig, ThroughputMonitor, derive_batch
    module = CausalLM(model_cfg, OptimConfig(lr=1e-3), total_steps=2000,
                      bytes_per_token=prepared.bytes_per_token, tokenizer=prepared.tokenizer)
"""

from scalelab.training.batch import BatchPlan, derive_batch, steps_from_budget
from scalelab.training.callbacks import TextSampler, ThroughputMonitor
from scalelab.training.config import OptimConfig
from scalelab.training.modules import (
    CausalLM,
    LMModule,
    MaskedLM,
    Seq2Seq,
    bits_per_byte,
    module_class,
)
from scalelab.training.optim import build_optimizer, param_groups
from scalelab.training.perf import peak_flops
from scalelab.training.schedules import build_lr_lambda

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
