"""Text samples from a decoder: prompt checks and seeded generation."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def prompt_ids(tokenizer: Any, prompt: str, vocab_size: int) -> list[int]:
    """Token ids of ``prompt``; an empty prompt starts from the end-of-text token.

    Raises ValueError naming the prompt when the tokenizer cannot encode it or its ids fall
    outside the model vocabulary.
    """
    try:
        ids = [int(i) for i in tokenizer.encode(prompt)] if prompt else []
    except Exception as e:
        raise ValueError(f"sample_prompt={prompt!r} cannot be encoded by the tokenizer: {e}") from e
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(
            f"sample_prompt={prompt!r} encodes to ids {bad} outside the model vocabulary "
            f"(vocab_size={vocab_size}); use a prompt the tokenizer knows"
        )
    return ids or [int(getattr(tokenizer, "eot_id", 0) or 0)]


@torch.no_grad()
def sample_text(model: nn.Module, tokenizer: Any, ids: list[int], device: torch.device, *,
                max_new_tokens: int, temperature: float, top_k: int | None, seed: int) -> str:
    """Decode ``ids`` + a continuation of ``max_new_tokens`` tokens.

    Runs under a forked RNG with a fixed seed: sampling does not change the training random
    stream, so a run is the same with or without samples.
    """
    x = torch.tensor([ids], dtype=torch.long, device=device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                             vocab_limit=getattr(tokenizer, "vocab_size", None))
    return str(tokenizer.decode(out[0].tolist()))
