"""The tanh-approximate GELU on a CPU in one pass (gelu_tanh.c), with torch's as the fallback.

torch's CPU kernel for ``F.gelu(x, approximate="tanh")`` computes its tanh through a slow vector
path: 2.5-4x the time of the exact GELU, ~15 % of a shakespeare_char training step in forward
and backward together (docs/performance.md). gelu_tanh.c computes the same function, as
x * sigmoid(2u), with one vector exp, forward and backward, on torch's own OpenMP pool.

The kernel is built on first use and cached per CPU (model/cpu_kernels.py). Where it cannot be
built or loaded, one warning says why and torch's kernel runs: the results agree either way to
float rounding. ``SCALELAB_FAST_GELU=0`` turns it off. It takes fp32 and bf16 CPU tensors
outside ``torch.compile`` (inductor fuses its own), on Linux x86-64 (glibc's vector exp; the
only hosts measured): elsewhere torch's kernel runs.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

from . import cpu_kernels

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
KERNEL = cpu_kernels.Kernel(
    "gelu_tanh", "GELU (tanh)", "SCALELAB_FAST_GELU",
    tuple((f"{name}_{suffix}", None) for name in ("gelu_tanh", "gelu_tanh_backward")
          for suffix in _SUFFIX.values()),
    libs=("-lmvec", "-lm"))
# Below this many elements torch's kernel runs: the autograd Function's Python work (~30 us a
# call, forward and backward) outweighs the gain. A sweep point's [448, 48] took 0.87-0.98x
# torch's time for up-projection + GELU + backward, [896, 48] 1.03-1.12x (1 and 2 threads).
MIN_ELEMENTS = 65536


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x, approximate="tanh")``, through the one-pass kernel where it applies."""
    if (x.device.type == "cpu" and x.dtype in _SUFFIX and x.numel() >= MIN_ELEMENTS
            and not torch.compiler.is_compiling() and library() is not None):
        if x.requires_grad and torch.is_grad_enabled():
            return _GeluTanh.apply(x)
        return _call("gelu_tanh", x.contiguous())  # sampling, validation: no graph to record
    return F.gelu(x, approximate="tanh")


class _GeluTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        ctx.save_for_backward(x)
        return _call("gelu_tanh", x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        if torch.is_grad_enabled():  # create_graph=True (a Hessian-vector product): torch's
            return torch.ops.aten.gelu_backward(grad, x, approximate="tanh")  # differentiable op
        return _call("gelu_tanh_backward", grad.to(x.dtype).contiguous(), x)


def _call(name: str, *inputs: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(inputs[-1])
    kernel = getattr(library(), f"{name}_{_SUFFIX[out.dtype]}")
    kernel(*(ctypes.c_void_p(t.data_ptr()) for t in (*inputs, out)), ctypes.c_int64(out.numel()),
           ctypes.c_int(torch.get_num_threads()))
    return out


def library() -> ctypes.CDLL | None:
    """The built kernel, or None (torch's GELU runs) with one warning saying why."""
    return cpu_kernels.load(KERNEL)
