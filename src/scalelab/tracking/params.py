"""The curated, flat parameter set every run logs (what the scaling fits read back).

N and FLOPs come from ModelConfig alone, so the numbers here are the ones the planner used.
"""

from __future__ import annotations

from typing import Any

from scalelab.model import ModelConfig
from scalelab.model.accounting import n_counts

SHAPE_KEYS = (
    "arch", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "norm", "norm_position",
    "mlp", "position", "vocab_size", "tie_embeddings", "dropout",
)


def run_params(
    model: ModelConfig,
    *,
    objective: str,
    seq_len: int,
    max_steps: int,
    tokens_per_step: int,
    global_batch_sequences: int,
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    strategy: str,
    precision: str,
    lr: float,
    tokenizer: str,
    dataset: str,
    seed: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Flat ``{name: value}`` for ``Tracker.log_params`` (keys are stable: sweeps query them)."""
    p: dict[str, Any] = {k: getattr(model, k) for k in SHAPE_KEYS}
    if model.arch == "encoder_decoder":
        p["n_encoder_layers"] = model.encoder_layers
        p["n_decoder_layers"] = model.decoder_layers
    tokens = max_steps * tokens_per_step
    fpt = model.flops_per_token(training=True, attention=True, seq_len=seq_len)
    fpt_6n = model.flops_per_token(training=True, attention=False, seq_len=seq_len)
    p.update(
        objective=objective,
        block_size=seq_len,
        seq_len=seq_len,
        **n_counts(model),  # n_params, n_params_non_embedding, n_params_matmul
        flops_per_token=fpt,
        flops_per_token_6n=fpt_6n,
        max_steps=max_steps,
        tokens_budget=tokens,
        compute=fpt * tokens,
        compute_6n=fpt_6n * tokens,
        lr=lr,
        global_batch_sequences=global_batch_sequences,
        global_batch_tokens=tokens_per_step,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        world_size=world_size,
        strategy=strategy,
        precision=precision,
        tokenizer=tokenizer,
        dataset=dataset,
        seed=seed,
    )
    p.update(extra or {})
    return p
