"""Peak FLOP/s of a device, for MFU: a datasheet table for GPUs, a measured matmul elsewhere.

Table values are *dense* (no 2:4 sparsity) tensor-core peaks from NVIDIA/AMD datasheets.
"""

from __future__ import annotations

import time

import torch

# Keys: "bf16" / "fp16" (tensor cores), "tf32" (fp32 matmuls allowed to use TF32), "fp32".
# Matched as substrings of the lower-cased torch.cuda.get_device_name(); first match wins, so
# more specific names come first.
GPU_PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("gb200", {"bf16": 2.5e15, "fp16": 2.5e15, "tf32": 1.25e15, "fp32": 80e12}),
    ("b200", {"bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15, "fp32": 80e12}),
    ("b100", {"bf16": 1.75e15, "fp16": 1.75e15, "tf32": 0.875e15, "fp32": 60e12}),
    ("h200", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("gh200", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("h100 nvl", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("h100 pcie", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12}),
    ("h100", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12}),  # SXM / HBM3
    ("h800", {"bf16": 989e12, "fp16": 989e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("a100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("a800", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("a10g", {"bf16": 70e12, "fp16": 70e12, "tf32": 35e12, "fp32": 31.2e12}),  # AWS G5 variant
    ("a10", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    ("a6000", {"bf16": 154.8e12, "fp16": 154.8e12, "tf32": 77.4e12, "fp32": 38.7e12}),
    ("a40", {"bf16": 149.7e12, "fp16": 149.7e12, "tf32": 74.8e12, "fp32": 37.4e12}),
    ("l40s", {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12}),
    ("l40", {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12}),
    ("l4", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12}),
    ("rtx 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12}),
    ("rtx 3090", {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12}),
    # Volta/Turing have no bf16: bf16 runs at the fp32 rate.
    ("v100", {"bf16": 15.7e12, "fp16": 125e12, "tf32": 15.7e12, "fp32": 15.7e12}),
    ("t4", {"bf16": 8.1e12, "fp16": 65e12, "tf32": 8.1e12, "fp32": 8.1e12}),
    ("mi300x", {"bf16": 1307e12, "fp16": 1307e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    ("mi250x", {"bf16": 383e12, "fp16": 383e12, "tf32": 95.7e12, "fp32": 95.7e12}),
]

_MEASURED: dict[tuple[str, str, int], float] = {}  # (device, dtype, threads) -> FLOP/s


def precision_kind(precision: str | int | None) -> str:
    """Map a Lightning precision ("bf16-mixed", "16-mixed", "32-true", 32, ...) to a table key."""
    p = str(precision if precision is not None else "32").lower()
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16") or p.startswith("fp16") or p == "half":
        return "fp16"
    if p.startswith("64"):
        return "fp32"  # no table has fp64 tensor cores; MFU vs fp32 is the honest upper bound
    if p.startswith("transformer-engine"):
        return "bf16"
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def lookup_gpu_peak(name: str, kind: str) -> float | None:
    """Datasheet peak for a GPU name (None when the name is not in the table)."""
    lname = name.lower()
    for key, peaks in GPU_PEAK_FLOPS:
        if key in lname:
            return peaks[kind]
    return None


def measure_matmul_flops(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_size: int = 1024,
    seconds: float = 0.3,
) -> float:
    """Best FLOP/s of square matmuls over about ``seconds`` (cached per device and dtype).

    The size doubles from 256 up to ``max_size`` while one matmul takes under 50 ms, so a slow
    path (bf16 on a CPU without bf16 units runs ~100x slower than fp32) still finishes in well
    under a second. Best-of rather than mean: it estimates what the hardware can do, not how
    busy it is right now.
    """
    device = torch.device(device)
    key = (str(device), str(dtype), torch.get_num_threads())  # CPU peak scales with threads
    if key in _MEASURED:
        return _MEASURED[key]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rate(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync()
        dt = max(time.perf_counter() - t0, 1e-9)
        return 2.0 * a.shape[0] ** 3 / dt, dt

    start = time.perf_counter()
    best, size = 0.0, 256
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        rate(a, b)  # warm up kernels, threads and allocator at this size
        flops, dt = rate(a, b)
        best = max(best, flops)
        if size >= max_size or dt > 0.05:
            break
        size *= 2
    while time.perf_counter() - start < seconds:
        best = max(best, rate(a, b)[0])
    _MEASURED[key] = best
    return best


def peak_flops(device: str | torch.device, precision: str | int | None = "32-true") -> float:
    """Peak FLOP/s of one ``device`` at a Lightning ``precision``.

    CUDA: the datasheet table by ``torch.cuda.get_device_name``; a GPU not in the table, and any
    CPU/MPS device, falls back to a short measured matmul in the matching dtype.
    """
    device = torch.device(device)
    kind = precision_kind(precision)
    if device.type == "cuda":
        peak = lookup_gpu_peak(torch.cuda.get_device_name(device), kind)
        if peak is not None:
            return peak
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, torch.float32)
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.bfloat16  # CPU autocast for "16-mixed" is not used; bf16 is the CPU half type
    return measure_matmul_flops(device, dtype)


def mfu(flops_per_sec_per_device: float, peak_per_device: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s per device / the device's peak FLOP/s."""
    return flops_per_sec_per_device / peak_per_device


def run_mfu(flops_per_sec_per_device: float, accelerator: str, precision: str) -> float | None:
    """MFU of a run on ``accelerator`` (Lightning's name: cpu, gpu, cuda, auto) at ``precision``;
    None when the peak cannot be had (MFU is informative only)."""
    try:
        use_cuda = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
        return mfu(flops_per_sec_per_device, peak_flops("cuda" if use_cuda else "cpu", precision))
    except Exception:
        return None
