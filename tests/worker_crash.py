"""A test worker that dies ends the run (tests/conftest.py takes these hooks).

When a worker dies (the kernel's out-of-memory killer, a crash, `kill -9`), pytest-xdist,
with `--max-worker-restart=0` (pyproject.toml's addopts), reports the test it was running
as failed, naming it, and hands out no more files; but the other workers would first finish
the files already queued to them (minutes, for the long ones). So the controlling process
signals them (STOP_SIGNAL), and each skips the test it is in ("not finished") and stops:
the run ends within seconds, failed, with the dead worker's test its one failure
(tests/test_worker_crash.py).
"""

import os
import signal

import pytest

STOP_SIGNAL = signal.SIGUSR1
STOPPED = "a worker died (the test it was running is reported as failed): the run stops"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist, in the controlling process: a worker is gone, `error` set if it died."""
    if error is None or str(node.config.getoption("maxworkerrestart")) != "0":
        return
    scheduler = getattr(node.config.pluginmanager.getplugin("dsession"), "sched", None)
    for other in getattr(scheduler, "nodes", ()):
        process = getattr(getattr(other.gateway, "_io", None), "popen", None)  # execnet's worker process
        if other is not node and process is not None and process.poll() is None:
            os.kill(process.pid, STOP_SIGNAL)


def pytest_sessionstart(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker
        session.config.pluginmanager.register(_StopOnSignal(session), "stop-on-signal")


class _StopOnSignal:
    """In an xdist worker: on STOP_SIGNAL, skip the test being set up or run, and run no
    more (the worker's loop ends at `session.shouldstop`, which it reports)."""

    def __init__(self, session):
        self.session = session
        self.running = None  # the test in its setup or call, where pytest takes what is raised
        signal.signal(STOP_SIGNAL, self.stop)

    def stop(self, signum, frame):
        self.session.shouldstop = STOPPED
        item, self.running = self.running, None
        if item is not None:
            pytest.skip(f"{item.nodeid} not finished: {STOPPED}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from self.run(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self.run(item))

    def run(self, item):
        self.running = item
        try:
            return (yield)
        finally:
            self.running = None
