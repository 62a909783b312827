"""Importing scalelab changes nothing in the process: environment, garbage collector, torch
threads and glibc's heap thresholds stay as they were. Each check runs in a fresh interpreter, since a
module is imported once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import ctypes, gc, json, os, sys
import torch  # loaded first, so that its thread settings can be compared

def mmapped_apart():
    # Bytes glibc maps outside its heap for a 31 MiB block: all of it by default, 0 once mallopt
    # raised the mmap threshold to glibc's 32 MiB cap. Measured once per process, after the
    # import: freeing a mapped block moves glibc's own threshold up to that block's size.
    if not sys.platform.startswith("linux"):
        return None
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype, libc.malloc.restype = MallInfo2, ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(31 << 20)
    mapped = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return mapped

def state():
    return {"env": dict(os.environ), "gc_enabled": gc.isenabled(),
            "gc_threshold": list(gc.get_threshold()), "gc_frozen": gc.get_freeze_count(),
            "threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads()}

before = state()
import scalelab, scalelab.cli, scalelab.cli.train  # noqa: E401
print(json.dumps({"before": before, "after": state(), "mmapped_apart": mmapped_apart()}))
"""


def test_importing_the_train_entry_point_changes_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SCALELAB_CONCURRENT_PROCS"}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    before, after = out["before"], out["after"]
    changed = {k: v for k, v in after["env"].items() if before["env"].get(k) != v}
    removed = sorted(set(before["env"]) - set(after["env"]))
    assert (changed, removed) == ({}, [])
    for key in ("gc_enabled", "gc_threshold", "gc_frozen", "threads", "interop"):
        assert after[key] == before[key], (key, before[key], after[key])
    if out["mmapped_apart"] is not None:  # glibc's heap keeps its default thresholds
        assert out["mmapped_apart"] >= 31 << 20
