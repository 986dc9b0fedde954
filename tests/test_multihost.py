"""Two processes of 4 CPU devices each, joined by `jax.distributed` as the hosts of a pod
are (`tests/multihost_check.py`): the objective, the fused head and the vocabulary-
parallel fused head on global arrays each host builds from its own rows equal the same
functions in one process on one device, on a mesh that splits the batch across the hosts
and on one that splits the vocabulary across them (each option set on the mesh that
splits what it sums across the hosts, `multihost_check.CASES_ON`; with --long on both).
"""

import os
import pathlib
import socket
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from tests import multihost_check as check
from tests import xla_flags
from tests.grid import LONG, long_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROCESSES = 2
# float32: the sharded paths sum per shard, then across shards (the vocabulary-parallel
# head also across hosts): a few hundred ulps of the largest value, as
# tests/test_vocab_parallel.py allows.
RTOL = 2e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_processes(out: pathlib.Path, count: int, *, timeout: float, join_timeout: int = 120,
                  every_case: bool = False) -> list[str]:
    """Starts `count` processes of the check (process ids 0..count-1; several tries at a
    free port), waits for all, and returns their stderr; a process that fails or a run
    past `timeout` seconds stops every process and fails with what they printed."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               TPU_ACCELERATOR_TYPE=os.environ.get("TPU_ACCELERATOR_TYPE", "v5litepod-4"))
    env["XLA_FLAGS"] = xla_flags.with_fast_compile()
    env.update(long_env(every_case))
    logs = [out / f"stderr_{i}.txt" for i in range(count)]
    procs = []
    try:
        for i in range(count):
            with open(logs[i], "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "tests" / "multihost_check.py"), "--port", str(port),
                     "--process-id", str(i), "--num-processes", str(PROCESSES), "--out", str(out),
                     "--timeout", str(join_timeout)],
                    env=env, stdout=subprocess.DEVNULL, stderr=log))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    texts = [log.read_text() for log in logs]
    codes = [p.returncode for p in procs]
    if any(codes):
        pytest.fail(f"processes exited with {codes} (timeout {timeout} s); their stderr's ends:\n"
                    + "\n".join(f"--- process {i}\n{t[-3000:]}" for i, t in enumerate(texts)))
    return texts


@pytest.fixture(scope="module")
def results(tmp_path_factory, request):
    out = tmp_path_factory.mktemp("multihost")
    run_processes(out, PROCESSES, timeout=600, every_case=request.config.getoption("--long"))
    return [dict(np.load(out / f"process_{i}.npz")) for i in range(PROCESSES)]


@pytest.fixture(scope="module")
def one_process():
    """The same functions, one device, unsharded."""
    arrays = {k: jnp.asarray(v) for k, v in check.inputs().items()}
    out = {}
    for case, options in check.CASES.items():
        for name, f in check.functions(check.number_tokens(), options).items():
            out[case, name] = {k: np.asarray(v) for k, v in check.flat(*f(arrays)).items()}
    return out


def test_each_host_feeds_its_own_rows(results):
    # Batch across hosts: host 0 holds rows 0-3, host 1 rows 4-7. Vocabulary across
    # hosts: every data shard has a device on each host, so both hold every row.
    assert [r["batch_across_hosts/local_rows"].tolist() for r in results] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r["vocab_across_hosts/local_rows"].tolist() for r in results] == [list(range(check.B))] * 2


@pytest.mark.parametrize("mesh, case", [
    pytest.param(mesh, case, marks=() if case in check.CASES_ON[mesh] else LONG)
    for mesh in check.CASES_ON for case in check.CASES])
def test_equal_to_one_process(results, one_process, mesh, case):
    names = {"objective": "objective", "fused": "fused", "fused_vocab_parallel": "fused"}
    for name, reference in names.items():
        want = one_process[case, reference]
        assert want["loss"] > 0 and np.abs(want.get("d_logits", want.get("d_hidden"))).max() > 0
        for process, got in enumerate(results):
            for key, value in want.items():
                have = got[f"{mesh}/{case}/{name}/{key}"]
                assert have.shape == value.shape, (name, key)
                error = np.max(np.abs(have - value)) / max(np.max(np.abs(value)), 1e-30)
                assert error <= RTOL, (process, name, key, error)


def test_the_hosts_see_the_same_numbers(results):
    first, *others = results
    for other in others:
        assert first.keys() == other.keys()
        for key in first:
            if not key.endswith("local_rows"):
                np.testing.assert_array_equal(first[key], other[key], err_msg=key)


def test_a_host_whose_peer_never_comes_fails_in_bounded_time(tmp_path):
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"processes exited with \[-?\d+\]") as failure:
        run_processes(tmp_path, 1, timeout=120, join_timeout=3)  # one of two processes
    assert time.monotonic() - start < 100
    assert "DEADLINE_EXCEEDED" in str(failure.value) or "could not join" in str(failure.value)
