"""A test worker that dies ends the run at once, failed, naming the test it was running
(tests/workers.py): a run of two files on two workers, one worker killed mid-test."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("xdist")
if not hasattr(signal, "SIGUSR1"):
    pytest.skip("the workers are stopped with SIGUSR1, which this system lacks", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
WAITING = 60  # the other worker's queue: 60 tests of a second each


def _wait_for(path, process, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"{path.name} was not written"
        time.sleep(0.1)
    return path.read_text()


def test_a_killed_worker_ends_the_run_and_is_named(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "from tests.workers import pytest_sessionfinish, pytest_sessionstart, pytest_terminal_summary, "
        "pytest_testnodedown  # noqa: F401\n")
    (tmp_path / "test_dies.py").write_text(textwrap.dedent("""
        import os, pathlib, time

        def test_dies():
            pathlib.Path("dies.pid").write_text(str(os.getpid()))
            time.sleep(600)
    """))
    (tmp_path / "test_waits.py").write_text(textwrap.dedent(f"""
        import pathlib, time
        import pytest

        @pytest.mark.parametrize("i", range({WAITING}))
        def test_waits(i):
            pathlib.Path("waits.started").write_text("yes")
            time.sleep(1)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", "-n", "2", "--dist", "loadfile",
         "--max-worker-restart=0", "test_dies.py", "test_waits.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pid = int(_wait_for(tmp_path / "dies.pid", process))
        _wait_for(tmp_path / "waits.started", process)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode not in (0, None), output
    assert "worker 'gw" in output and "crashed while running 'test_dies.py::test_dies'" in output, output
    assert "FAILED test_dies.py::test_dies" in output, output
    assert "not finished: a worker died" in output, output  # the other worker stopped mid-test
    assert took < 30, f"the run ended {took:.0f} s after the kill:\n{output}"
    assert re.search(r"^peak memory \(resident\): gw\d \d+\.\d\d GiB$", output, re.M), output  # the live worker's
