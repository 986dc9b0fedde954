"""XLA flags for the tests' processes, and for the subprocesses they start.

The tests compile thousands of small programs and run each only a few times, so XLA's CPU
backend spends most of their time optimising machine code (LLVM) that then runs for
microseconds. Without that optimisation the suite takes about half the time. The
programs compute the same operations; the tolerances are those of float32, which do not
depend on how the machine code was optimised."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0"


def with_fast_compile(flags: str = "") -> str:
    """`flags` (an XLA_FLAGS value) with `FAST_COMPILE` added once."""
    return flags if FAST_COMPILE in flags.split() else f"{flags} {FAST_COMPILE}".strip()


def host_devices(count: int) -> str:
    """XLA_FLAGS for a process with `count` host CPU devices, compiling fast."""
    return with_fast_compile(f"--xla_force_host_platform_device_count={count}")


def use_fast_compile() -> None:
    """Adds `FAST_COMPILE` to this process's XLA_FLAGS (before JAX starts its backend)."""
    os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS", ""))
