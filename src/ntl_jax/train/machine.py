"""The machine a run or a measurement comes from, for its record."""

from __future__ import annotations

import platform


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (per-seed values and timings follow its float kernels); where
    `cpuinfo` cannot be read or names none, what `platform` knows."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
