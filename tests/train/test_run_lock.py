"""One run per directory: the trainer's lock on `<out>/.lock`, raced by real processes."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("fcntl")

from ntl_jax.train import trainer  # noqa: E402

ROUNDS = 50
WORKERS = 3
# Spawned, not forked: the parent has imported JAX, whose threads make fork unsafe.
CTX = multiprocessing.get_context("spawn")


def _race(rank, out_dir, rounds, prefill, barrier, results):
    """Each round: all workers try at once; the winner holds the lock until every worker
    has tried, then releases it. With `prefill`, an empty `.lock` is there beforehand."""
    path = os.path.join(out_dir, ".lock")
    for r in range(rounds):
        barrier.wait()
        if prefill and rank == 0:
            open(path, "w").close()
        barrier.wait()
        lock = trainer._RunLock(out_dir)
        try:
            lock.__enter__()
            results.put((r, rank, os.getpid(), ""))
        except ValueError as e:
            lock = None
            results.put((r, rank, os.getpid(), str(e)))
        barrier.wait()
        if lock is not None:
            lock.__exit__(None, None, None)


def _churn(out_dir, wins_wanted, barrier, results):
    """Takes and releases the lock as fast as it can until it has held it `wins_wanted`
    times; while holding it, claims a marker file that only one process may hold at a time."""
    marker = os.path.join(out_dir, "held")
    wins = losses = clashes = 0
    barrier.wait()  # all start together, so they contend
    while wins < wins_wanted and losses < 1_000_000:
        lock = trainer._RunLock(out_dir)
        try:
            lock.__enter__()
        except ValueError:
            losses += 1
            continue
        wins += 1
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            os.remove(marker)
        except FileExistsError:
            clashes += 1
        lock.__exit__(None, None, None)
    results.put((wins, losses, clashes))


def _start(target, *args):
    p = CTX.Process(target=target, args=args)
    p.start()
    return p


def _join(processes):
    for p in processes:
        p.join(timeout=300)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"


@pytest.mark.parametrize("prefill", [False, True], ids=["no-file", "empty-file"])
def test_exactly_one_process_wins_each_round(tmp_path, prefill):
    barrier, results = CTX.Barrier(WORKERS), CTX.Queue()
    workers = [_start(_race, rank, str(tmp_path), ROUNDS, prefill, barrier, results)
               for rank in range(WORKERS)]
    outcomes = [results.get(timeout=300) for _ in range(ROUNDS * WORKERS)]
    _join(workers)
    for r in range(ROUNDS):
        this_round = [o for o in outcomes if o[0] == r]
        winners = [pid for _, _, pid, error in this_round if not error]
        assert len(this_round) == WORKERS and len(winners) == 1, (r, this_round)
        for _, _, _, error in this_round:
            if error:
                # the winner's PID, or "unknown" if it had not written it yet
                holder = re.search(r"another process \(PID (\w+)\) is training in (\S+):", error)
                assert holder and holder.group(1) in (str(winners[0]), "unknown"), error
                assert holder.group(2) == str(tmp_path) and "one run per --out" in error
    assert not (tmp_path / ".lock").exists()  # released: the last holder removed it


def test_no_two_holders_while_the_lock_is_taken_and_released_in_a_loop(tmp_path):
    # A holder unlinks the file on release; a process that opened the old file just
    # before must not end up holding a lock on it next to the holder of a new file.
    barrier, results = CTX.Barrier(WORKERS), CTX.Queue()
    workers = [_start(_churn, str(tmp_path), 100, barrier, results) for _ in range(WORKERS)]
    counts = [results.get(timeout=300) for _ in range(WORKERS)]
    _join(workers)
    assert [wins for wins, _, _ in counts] == [100] * WORKERS  # each took its turns
    assert sum(losses for _, losses, _ in counts) > 0  # while the others held it
    assert [clashes for _, _, clashes in counts] == [0] * WORKERS


HOLD = """
import sys, time
from ntl_jax.train import trainer
trainer._RunLock(sys.argv[1]).__enter__()
print("locked", flush=True)
time.sleep(300)
"""


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"another process \(PID {holder.pid}\) is training "
                                             rf"in {re.escape(str(tmp_path))}: expected one run"):
            trainer._RunLock(str(tmp_path)).__enter__()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    # The kernel released the lock; the file with the dead process's PID is still there.
    assert (tmp_path / ".lock").read_text().strip() == str(holder.pid)
    with trainer._RunLock(str(tmp_path)):
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(ValueError, match=rf"another process \(PID {os.getpid()}\)"):
            trainer._RunLock(str(tmp_path)).__enter__()  # a second run in this process too
    assert not (tmp_path / ".lock").exists()


def test_a_pid_in_an_unlocked_file_decides_nothing(tmp_path):
    # A file naming a live process (this one's parent) that does not lock it is not a lock.
    (tmp_path / ".lock").write_text(f"{os.getppid()}\n")
    with trainer._RunLock(str(tmp_path)):
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
