"""The test workers (pytest-xdist; tests/conftest.py takes these hooks): one that dies
ends the run, and the run reports each worker's peak memory.

When a worker dies (the kernel's out-of-memory killer, a crash, `kill -9`), pytest-xdist,
with `--max-worker-restart=0` (pyproject.toml's addopts), reports the test it was running
as failed, naming it, and hands out no more files; but the other workers would first finish
the files already queued to them (minutes, for the long ones). So the controlling process
signals them (STOP_SIGNAL), and each skips the test it is in ("not finished") and stops:
the run ends within seconds, failed, with the dead worker's test its one failure
(tests/test_worker_crash.py).

At the end each worker sends back its peak resident memory (`ru_maxrss`), and the summary
prints them: what the test command needs (docs/development.md).
"""

import os
import signal
import sys

import pytest

try:
    import resource
except ImportError:  # Windows
    resource = None

STOP_SIGNAL = getattr(signal, "SIGUSR1", None)  # None on Windows: the run then ends as xdist ends it
STOPPED = "a worker died (the test it was running is reported as failed): the run stops"


_PEAKS = {}  # in the controlling process: each finished worker's peak resident memory, in KiB


def _peak_kib():
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak // 1024 if sys.platform == "darwin" else peak


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist, in the controlling process: a worker is gone, `error` set if it died."""
    if error is None:
        peak = getattr(node, "workeroutput", {}).get("peak_rss_kib")
        if peak is not None:
            _PEAKS[node.gateway.id] = peak
        return
    if STOP_SIGNAL is None or str(node.config.getoption("maxworkerrestart")) != "0":
        return
    scheduler = getattr(node.config.pluginmanager.getplugin("dsession"), "sched", None)
    for other in getattr(scheduler, "nodes", ()):
        process = getattr(getattr(other.gateway, "_io", None), "popen", None)  # execnet's worker process
        if other is not node and process is not None and process.poll() is None:
            os.kill(process.pid, STOP_SIGNAL)


def pytest_sessionstart(session):
    if hasattr(session.config, "workerinput") and STOP_SIGNAL is not None:  # an xdist worker
        session.config.pluginmanager.register(_StopOnSignal(session), "stop-on-signal")


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: xdist sends this back once the hook is done
        workeroutput["peak_rss_kib"] = _peak_kib()


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    peaks = sorted(_PEAKS.items()) if _PEAKS else [("this process", _peak_kib())]
    if all(kib is not None for _, kib in peaks):
        terminalreporter.write_line("peak memory (resident): " + ", ".join(
            f"{name} {kib / 2**20:.2f} GiB" for name, kib in peaks))


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
