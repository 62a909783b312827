"""The tanh-approximate GELU on a CPU in one pass (gelu_tanh.c), with torch's as the fallback.

torch's CPU kernel for ``F.gelu(x, approximate="tanh")`` computes its tanh through a slow vector
path: 2.5-4x the time of the exact GELU, ~15 % of a shakespeare_char training step in forward
and backward together (docs/performance.md). gelu_tanh.c computes the same function, as
x * sigmoid(2u), with one vector exp, forward and backward, on torch's own OpenMP pool.

The kernel is built on first use with the system's C compiler (``CC``, else ``cc``; well under
a second, no torch headers) for this CPU, into ``SCALELAB_KERNEL_CACHE`` (else
``$XDG_CACHE_HOME/scalelab/kernels``, else ``~/.cache/scalelab/kernels``) under a name keyed by
the source, the flags and the CPU, and loaded from there by every later process. Where it cannot
be built or loaded (no compiler, a read-only cache, not glibc), one warning says why and torch's
kernel runs: the results agree either way to float rounding. ``SCALELAB_FAST_GELU=0`` turns it
off. It takes fp32 and bf16 CPU tensors outside ``torch.compile`` (inductor fuses its own), on
Linux x86-64 (glibc's vector exp; the only hosts measured): elsewhere torch's kernel runs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

SOURCE = Path(__file__).with_name("gelu_tanh.c")
# -march=native: built per CPU (the cache key holds it); 512-bit vectors where the CPU has them
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno",
         "-fPIC", "-shared")
SUPPORTED = platform.system() == "Linux" and platform.machine() == "x86_64"
LIBS = ("-lmvec", "-lm")
BUILD_TIMEOUT_S = 120
# Below this many elements torch's kernel runs: the autograd Function's Python work (~30 us a
# call, forward and backward) outweighs the gain. A sweep point's [448, 48] took 0.87-0.98x
# torch's time for up-projection + GELU + backward, [896, 48] 1.03-1.12x (1 and 2 threads).
MIN_ELEMENTS = 65536
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
log = logging.getLogger(__name__)


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


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel, or None (torch's GELU runs) with one warning saying why."""
    if not SUPPORTED or os.environ.get("SCALELAB_FAST_GELU", "1") == "0":
        return None
    if not _torch_runs_libgomp():
        # the kernel would bring a second OpenMP runtime, whose threads contend with torch's
        log.warning("GELU (tanh): torch's kernel runs: torch's OpenMP runtime is not libgomp")
        return None
    try:
        lib = ctypes.CDLL(str(_built()))
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("GELU (tanh): torch's kernel runs, scalelab's faster one is unavailable: %s",
                    str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
        return None
    for name in ("gelu_tanh", "gelu_tanh_backward"):
        for suffix in _SUFFIX.values():
            getattr(lib, f"{name}_{suffix}").restype = None
    return lib


def _built() -> Path:
    """The shared library for this source, these flags and this CPU: from the cache, else
    compiled into it (to a temporary name, then renamed, so processes that start together
    never load a half-written file)."""
    compiler = os.environ.get("CC") or "cc"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), " ".join(FLAGS + LIBS).encode(),
                                     _cpu_identity().encode()])).hexdigest()[:16]
    target = cache_dir() / f"gelu_tanh-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".gelu_tanh-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, *LIBS], capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise OSError(f"{compiler} failed: {(proc.stderr or proc.stdout).strip() or proc.returncode}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("GELU (tanh): built scalelab's CPU kernel into %s", target)
    return target


def _torch_runs_libgomp() -> bool:
    """Whether torch loaded libgomp (the pip wheels' OpenMP), which the kernel then shares: its
    ``libgomp.so.1`` resolves to the library already loaded under that name."""
    try:
        return "/libgomp" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def cache_dir() -> Path:
    if os.environ.get("SCALELAB_KERNEL_CACHE"):
        return Path(os.environ["SCALELAB_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scalelab" / "kernels"


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU's model and its flags (Linux), else the platform."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines))
