"""Building scalelab's CPU kernels for an x86-64 level other than this CPU's
(``SCALELAB_KERNEL_ARCH``): each level its own cached library, and a level a CPU cannot run, or
a name that is none, refused with one warning while torch's op runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.model import cpu_kernels

pytestmark = pytest.mark.skipif(
    not cpu_kernels.SUPPORTED or shutil.which(os.environ.get("CC") or "cc") is None,
    reason="the kernels are built with a C compiler on Linux x86-64")

# the flags line of an AVX2 CPU without AVX-512 (of the kind of AMD's Zen 3), as /proc/cpuinfo
# lists them
AVX2_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
              "fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good "
              "nopl nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid "
              "sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm "
              "cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext "
              "invpcid_single ssbd ibrs ibpb stibp vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 "
              "erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero "
              "xsaveerptr arat npt nrip_save umip vaes vpclmulqdq rdpid fsrm")
AVX2_CPU = set(AVX2_FLAGS.split())


def test_a_level_is_taken_where_the_cpu_runs_it_and_refused_where_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernels.ARCH_SWITCH, "x86-64-v3")
    assert cpu_kernels.target_arch(AVX2_CPU) == "x86-64-v3"
    monkeypatch.setenv(cpu_kernels.ARCH_SWITCH, "x86-64-v4")
    with pytest.raises(OSError, match="SCALELAB_KERNEL_ARCH=x86-64-v4: this CPU lacks avx512bw "
                                      "avx512cd avx512dq avx512f avx512vl; name a lower level"):
        cpu_kernels.target_arch(AVX2_CPU)
    monkeypatch.delenv(cpu_kernels.ARCH_SWITCH)
    assert cpu_kernels.target_arch(AVX2_CPU) == "native"


# the GELU on a tensor large enough for the kernel; which of the two ran is in its grad_fn
_GELU = ("import logging, torch; logging.basicConfig(level=logging.INFO);"
         "from scalelab.model import fast_gelu;"
         "y = fast_gelu.gelu_tanh(torch.randn(512, 256, requires_grad=True));"
         "print(type(y.grad_fn).__name__)")


def _gelu(cache: Path, arch: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SCALELAB_KERNEL_CACHE": str(cache), cpu_kernels.ARCH_SWITCH: arch}
    return subprocess.run([sys.executable, "-c", _GELU], capture_output=True, text=True,
                          timeout=300, env=env)


def test_each_level_builds_its_own_library(tmp_path: Path) -> None:
    if missing := cpu_kernels.missing_flags("x86-64-v3"):
        pytest.skip(f"this CPU cannot run x86-64-v3 code (no {' '.join(missing)})")
    for arch in ("native", "x86-64-v3"):
        proc = _gelu(tmp_path, arch)
        assert proc.returncode == 0 and proc.stdout.strip() == "_GeluTanhBackward", proc.stderr
    assert len(list(tmp_path.glob("gelu_tanh-*.so"))) == 2


def test_a_name_that_is_no_level_falls_back_with_one_warning(tmp_path: Path) -> None:
    proc = _gelu(tmp_path, "zen3")
    assert proc.returncode == 0 and proc.stdout.strip() == "GeluBackward0", proc.stderr  # torch's
    warnings = [ln for ln in proc.stderr.splitlines() if "GELU (tanh)" in ln]
    assert len(warnings) == 1, proc.stderr
    assert ("SCALELAB_KERNEL_ARCH='zen3' is not one of native, x86-64, x86-64-v2, x86-64-v3, "
            "x86-64-v4") in warnings[0]
    assert not any(tmp_path.iterdir())  # nothing built, nothing left behind
