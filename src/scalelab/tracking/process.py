"""Whether the process a run's tags name (scalelab.host/pid/pid_start) still runs: the one
answer used by stale-run recovery, sweep reruns and resume."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def process_alive(tags: Mapping[str, str]) -> bool:
    """Whether the process named by a run's tags (scalelab.host/pid/pid_start) still runs here.

    False when the host is this one and the PID is gone or now belongs to a younger process
    (PID reuse); also False without the tags (runs from before they existed). A run on
    another host cannot be checked from here: True (leave it alone).
    """
    host, pid = tags.get("scalelab.host"), tags.get("scalelab.pid", "")
    if not host or not pid.isdigit():
        return False
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that PID: not ours any more
        return False
    start = tags.get("scalelab.pid_start")
    if start:
        import psutil

        try:
            return abs(psutil.Process(int(pid)).create_time() - float(start)) < 1.0
        except (psutil.Error, ValueError):
            return False
    return True


__all__ = ["process_alive"]
