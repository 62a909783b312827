"""scalelab's C kernels for the CPU (``model/*.c``): built on first use, cached per CPU, shared.

Each kernel is one C file next to this module, compiled with the system's C compiler (``CC``,
else ``cc``; one to three seconds, no torch headers) for this CPU (``-march=native``) into
``SCALELAB_KERNEL_CACHE`` (else ``$XDG_CACHE_HOME/scalelab/kernels``, else
``~/.cache/scalelab/kernels``) under a name keyed by the source, the flags and the CPU, and
loaded from there by every later process. Where a kernel cannot be built or loaded (no
compiler, a read-only cache, not glibc), ``load`` logs one warning saying why and returns None,
and its caller runs its other path (``Kernel.fallback``): the results agree either way to float
rounding. Each
kernel has an environment switch that turns it off (``<switch>=0``).

``SCALELAB_KERNEL_ARCH`` (one of ``ARCH_LEVELS``) builds for an x86-64 level instead of this
CPU: the code an older CPU would run (``x86-64-v3``: AVX2 and FMA, as AMD's Zen 1-3; ``x86-64-v2``:
SSE4.2), so it can be tested and timed on this one. A level this CPU cannot run is refused with
the warning above, not loaded.

The kernels use OpenMP and are linked against the libgomp that torch already loaded (the same
soname), so their loops run on torch's own thread pool; with another OpenMP runtime in torch
they stay off. Linux x86-64 only, the only hosts measured.
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
from dataclasses import dataclass
from pathlib import Path

SUPPORTED = platform.system() == "Linux" and platform.machine() == "x86_64"
# -march: this CPU's by default (the cache key holds it); 512-bit vectors where the CPU has them.
# -fno-trapping-math: nothing here reads floating-point exception flags, and without it GCC kept a
# branch in the attention kernel's exp (it will not compute past a select that might trap unless
# the vector unit can mask, as AVX-512's can): its AVX2 build's loops ran scalar, at half the speed.
FLAGS = ("-O3", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
         "-fPIC", "-shared")
ARCH_SWITCH = "SCALELAB_KERNEL_ARCH"
_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
# the x86-64 micro-architecture levels GCC and Clang build for, with the /proc/cpuinfo flags each
# needs to run
ARCH_LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64": (), "x86-64-v2": _V2, "x86-64-v3": _V3,
    "x86-64-v4": (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
BUILD_TIMEOUT_S = 120
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernel:
    """``name``.c next to this module; ``label`` names it in the log; ``switch`` is the
    environment variable that turns it off with 0; ``functions`` maps each exported function
    to its ctypes return type (None: void); ``fallback`` says what runs without it."""

    name: str
    label: str
    switch: str
    functions: tuple[tuple[str, type | None], ...]
    flags: tuple[str, ...] = ()
    libs: tuple[str, ...] = ("-lm",)
    fallback: str = "torch's kernel runs"

    @property
    def source(self) -> Path:
        return Path(__file__).with_name(f"{self.name}.c")


@functools.cache
def load(kernel: Kernel) -> ctypes.CDLL | None:
    """The built kernel, or None (the caller runs torch's op) with one warning saying why."""
    if not SUPPORTED or os.environ.get(kernel.switch, "1") == "0":
        return None
    if not _torch_runs_libgomp():
        # the kernel would bring a second OpenMP runtime, whose threads contend with torch's
        log.warning("%s: %s: torch's OpenMP runtime is not libgomp", kernel.label, kernel.fallback)
        return None
    try:
        lib = ctypes.CDLL(str(built(kernel)))
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("%s: %s, scalelab's faster one is unavailable: %s", kernel.label, kernel.fallback,
                    str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
        return None
    for name, restype in kernel.functions:
        getattr(lib, name).restype = restype
    return lib


def built(kernel: Kernel) -> Path:
    """The shared library for this source, these flags and this CPU: from the cache, else
    compiled into it (to a temporary name, then renamed, so processes that start together
    never load a half-written file)."""
    compiler = os.environ.get("CC") or "cc"
    flags = (*FLAGS, f"-march={target_arch()}", *kernel.flags)
    key = hashlib.sha256(b"\0".join([kernel.source.read_bytes(), compiler.encode(),
                                     " ".join(flags + kernel.libs).encode(),
                                     _cpu_identity().encode()])).hexdigest()[:16]
    target = cache_dir() / f"{kernel.name}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{kernel.name}-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *flags, str(kernel.source), "-o", tmp, *kernel.libs],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise OSError(f"{compiler} failed: {(proc.stderr or proc.stdout).strip() or proc.returncode}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("%s: built scalelab's CPU kernel into %s", kernel.label, target)
    return target


def target_arch(flags: set[str] | None = None) -> str:
    """What the kernels are built for: ``native`` (this CPU), or the level ``SCALELAB_KERNEL_ARCH``
    names where a CPU with ``flags`` (this one's by default) can run it (OSError otherwise:
    ``load`` warns and returns None)."""
    arch = os.environ.get(ARCH_SWITCH) or "native"
    if arch == "native":
        return arch
    if arch not in ARCH_LEVELS:
        raise OSError(f"{ARCH_SWITCH}={arch!r} is not one of native, {', '.join(ARCH_LEVELS)}")
    if missing := missing_flags(arch, flags):
        raise OSError(f"{ARCH_SWITCH}={arch}: this CPU lacks {' '.join(missing)}; name a lower level "
                      "or unset it")
    return arch


def missing_flags(arch: str, flags: set[str] | None = None) -> list[str]:
    """The flags level ``arch`` of ``ARCH_LEVELS`` needs that a CPU with ``flags`` (this one's by
    default) lacks, sorted: none where it can run that level's code."""
    return sorted(set(ARCH_LEVELS[arch]) - (cpu_flags() if flags is None else flags))


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo); empty where it cannot be read."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for ln in info.splitlines() if ln.startswith("flags") for f in ln.split(":", 1)[1].split()}


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
