"""One row per variant fact: what validation and the exact accounting need to know about
each name a ModelConfig string field accepts (``arch``, ``norm``, ``norm_position``, ``mlp``,
``position``).

The classes that implement the variants live next door (norms.py, mlp.py, positions.py,
blocks.py), each in a registry keyed by the same names. Each module checks at import that
its registry and its table here name the same variants, so a class without a row (or a row
without a class) fails loudly instead of being counted wrong. The tables are torch-free, so
ModelConfig, its accounting and the sweep planner run without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Arch:
    """Which stacks a model has. Both stacks: the decoder cross-attends to the encoder."""

    encoder: bool  # a bidirectional stack
    decoder: bool  # a causal stack (it feeds the output layer when present)
    objective: str  # the training objective that fits it; training/ and the run config read it

    @property
    def cross(self) -> bool:
        return self.encoder and self.decoder


@dataclass(frozen=True)
class NormShape:
    """Per-channel parameters of a norm layer (d_model each)."""

    gain: bool  # a learned scale
    bias: bool  # a learned shift, present only when ModelConfig.bias is true

    def n_params(self, d_model: int, bias: bool) -> int:
        return d_model * (int(self.gain) + int(self.bias and bias))


@dataclass(frozen=True)
class NormPosition:
    """Where the residual wrapper normalizes (blocks.RESIDUAL_CLASSES builds it)."""

    final_norm: bool  # the default of ModelConfig.final_norm: does the stack end with a norm?


@dataclass(frozen=True)
class MLPShape:
    """The matrices of a position-wise MLP: n_in matrices d -> d_ff, then one d_ff -> d."""

    n_in: int  # 1: up; 2: gate and up (gated MLPs)
    hidden: Fraction  # d_ff = hidden * d_model when ModelConfig.d_ff is null (floored)
    round_up: bool  # then round d_ff UP to a multiple of ModelConfig.ffn_multiple_of

    def default_d_ff(self, d_model: int, multiple_of: int) -> int:
        d_ff = math.floor(self.hidden * d_model)
        return multiple_of * math.ceil(d_ff / multiple_of) if self.round_up else d_ff

    def n_params(self, d_model: int, d_ff: int, bias: bool) -> int:
        weights = (self.n_in + 1) * d_model * d_ff
        biases = self.n_in * d_ff + d_model if bias else 0
        return weights + biases


@dataclass(frozen=True)
class PositionShape:
    """Parameters a position scheme adds, and the dimension it needs to be even."""

    table: bool = False  # a learned [max_seq_len, d_model] table (an embedding, counted once)
    even: str | None = None  # a ModelConfig attribute that must be even, e.g. "head_dim"
    why: str = ""  # the reason, for the error message

    def n_params(self, max_seq_len: int, d_model: int) -> int:
        return max_seq_len * d_model if self.table else 0


ARCHS: dict[str, Arch] = {
    "decoder": Arch(encoder=False, decoder=True, objective="causal"),  # GPT
    "encoder": Arch(encoder=True, decoder=False, objective="mlm"),  # BERT
    "encoder_decoder": Arch(encoder=True, decoder=True, objective="seq2seq"),  # 2017 Transformer
}
OBJECTIVE_OF_ARCH: dict[str, str] = {name: arch.objective for name, arch in ARCHS.items()}

NORMS: dict[str, NormShape] = {
    "layernorm": NormShape(gain=True, bias=True),
    "rmsnorm": NormShape(gain=True, bias=False),
}

NORM_POSITIONS: dict[str, NormPosition] = {
    "pre": NormPosition(final_norm=True),  # x + F(norm(x)): the stream itself is never normalized
    "post": NormPosition(final_norm=False),  # norm(x + F(x)): the output already is
}

# Gated MLPs have three matrices instead of two, so d_ff shrinks to 8d/3 to keep ~8d^2
# parameters (Shazeer 2020, Llama), rounded up to ffn_multiple_of for matmul-friendly shapes.
_TWO_LAYER = MLPShape(n_in=1, hidden=Fraction(4), round_up=False)
_GATED = MLPShape(n_in=2, hidden=Fraction(8, 3), round_up=True)
MLPS: dict[str, MLPShape] = {
    "gelu": _TWO_LAYER,
    "gelu_exact": _TWO_LAYER,
    "relu": _TWO_LAYER,
    "swiglu": _GATED,
    "geglu": _GATED,
}

POSITIONS: dict[str, PositionShape] = {
    "learned": PositionShape(table=True),
    "sinusoidal": PositionShape(even="d_model", why="sin/cos come in pairs"),
    "rope": PositionShape(even="head_dim", why="RoPE rotates pairs of dims of each head"),
    "alibi": PositionShape(),
    "none": PositionShape(),
}


def check_registry(field: str, classes: Mapping[str, object], table: Mapping[str, object]) -> None:
    """Raise unless a module's class registry and its fact table name the same variants."""
    if set(classes) != set(table):
        raise TypeError(
            f"ModelConfig.{field}: classes {sorted(classes)} and accounting rows {sorted(table)} "
            f"differ; every {field} variant needs a class and a row in scalelab/model/variants.py")
