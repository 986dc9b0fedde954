"""XLA flags for the tests' processes, and for the subprocesses they start.

The tests compile thousands of small programs and run each only a few times, so XLA's CPU
backend spends most of their time optimising machine code (LLVM) that then runs for
microseconds. Without that optimisation the suite takes about half the time. The
programs compute the same operations; the tolerances are those of float32, which do not
depend on how the machine code was optimised."""

import os
import shutil
import tempfile

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


CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
_created_cache = None


def share_compiled_programs() -> None:
    """Points JAX's persistent compilation cache at one folder for this test run (unless
    the caller chose one), before JAX reads its configuration: the test workers, the
    subprocesses the tests start and, in `.ci/run`, the later passes, which share many
    programs, load them instead of compiling them again. Every program is kept, however
    fast it compiled. The cache is keyed by the program, the compile options and the
    versions of jax and jaxlib, so a program loaded is the program compiled."""
    global _created_cache
    if not os.environ.get(CACHE_DIR):  # set: a run that chose one, or a worker of this run
        _created_cache = os.environ[CACHE_DIR] = tempfile.mkdtemp(prefix="ntl_jax_tests_jax_cache_")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def remove_created_cache() -> None:
    """Removes the folder `share_compiled_programs` made in this process, if it made one."""
    if _created_cache:
        shutil.rmtree(_created_cache, ignore_errors=True)
