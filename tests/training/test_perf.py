from __future__ import annotations

import pytest
import torch

from scalelab.training import peak_flops
from scalelab.training.perf import lookup_gpu_peak, precision_kind


@pytest.mark.parametrize(
    ("name", "kind", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA A100-SXM4-40GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5e12),
        ("NVIDIA A10G", "bf16", 70e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA GeForce RTX 4090", "fp16", 165.2e12),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla T4", "fp16", 65e12),
    ],
)
def test_gpu_table(name: str, kind: str, peak: float) -> None:
    assert lookup_gpu_peak(name, kind) == peak


def test_unknown_gpu_is_none() -> None:
    assert lookup_gpu_peak("Some Future Accelerator", "bf16") is None


def test_precision_kinds() -> None:
    assert precision_kind("bf16-mixed") == "bf16"
    assert precision_kind("bf16-true") == "bf16"
    assert precision_kind("16-mixed") == "fp16"
    assert precision_kind(16) == "fp16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert precision_kind("32-true") == "fp32"
        torch.set_float32_matmul_precision("high")  # TF32 allowed
        assert precision_kind(32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_cpu_peak_is_measured_once() -> None:
    p1 = peak_flops("cpu", "32-true")
    p2 = peak_flops(torch.device("cpu"), "32-true")
    assert p1 == p2  # cached per process: two timed measurements never agree to the last bit
    assert 1e8 < p1 < 1e14  # somewhere between a slow laptop core and a big server
