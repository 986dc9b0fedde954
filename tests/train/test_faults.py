"""Faults around a training run: damaged checkpoints, a checkpoint beyond --steps, two
runs in one directory, a torn log line. Each ends in a clear error or a correct result,
and nothing is deleted."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from conftest import fake_data, micro_config  # noqa: E402

from ntl_jax.train import trainer  # noqa: E402
from ntl_jax.train.checkpoint import CheckpointError  # noqa: E402


def _data(vocabulary):
    return fake_data(vocabulary, n=32)


def _train(data, out, **kw):
    # Checkpoints every 2 of 6 steps: there is always an older one to fall back to.
    config = micro_config(data, steps=6, seed=1, warmup_steps=1, checkpoint_every=2)
    return trainer.train(config, str(out), data=data, progress=False, tensorboard=False, **kw)


def _files(directory):
    return sorted(os.path.relpath(os.path.join(r, f), directory)
                  for r, _, fs in os.walk(directory) for f in fs)


def _state_files(step_dir):
    return [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state"))
            for f in fs]


def _largest_state_file(step_dir):
    return max(_state_files(step_dir), key=os.path.getsize)


def _where_stored(step_dir, state):
    """[(file, offset)] of each copy of the first parameter array whose raw bytes the
    checkpoint's files hold (orbax stores some arrays uncompressed, in the process's
    files and in the merged ones it reads: damage there reads back without complaint)."""
    paths = _state_files(step_dir)
    for leaf in jax.tree_util.tree_leaves(state.params):
        needle = np.asarray(leaf).tobytes()[:32]
        hits = [(path, open(path, "rb").read().find(needle)) for path in paths]
        hits = [(path, offset) for path, offset in hits if offset >= 0]
        if len(needle) == 32 and hits:
            return hits
    pytest.fail("no parameter array is stored uncompressed in the checkpoint")


def _assert_same_state(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def full_run(vocabulary, tmp_path):
    data = _data(vocabulary)
    return data, _train(data, tmp_path / "full")


@pytest.mark.parametrize("damage", ["one bit", "400 bytes"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_falls_back(full_run, tmp_path,
                                                                   capsys, damage):
    data, full = full_run
    out = tmp_path / "run"
    stopped = _train(data, out, stop_after=4)  # checkpoints 2 and 4
    step_dir = out / "checkpoints" / "4"
    for target, offset in _where_stored(step_dir, stopped["state"]):
        with open(target, "r+b") as f:
            content = bytearray(f.read())
            if damage == "one bit":  # the lowest bit of a float32: a change of one ulp
                content[offset] ^= 0x01
            else:
                content[offset:offset + 400] = bytes(b ^ 0xFF
                                                     for b in content[offset:offset + 400])
            f.seek(0)
            f.write(content)
    files = _files(step_dir)
    resumed = _train(data, out)
    said = capsys.readouterr().out
    assert f"the checkpoint at {step_dir}" in said and "falling back to the checkpoint of " \
        "step 2, which verifies" in said
    assert "resuming from step 2" in said
    # Either orbax cannot decode the chunk, or it decodes other numbers the checksum sees.
    assert "fails its checksum" in said or "is damaged or does not match" in said
    # Nothing deleted: the damaged checkpoint moved whole; the rerun ends as if undisturbed.
    assert _files(out / "damaged_checkpoints" / "4") == files
    assert resumed["step"] == 6
    _assert_same_state(full["state"], resumed["state"])
    assert resumed["eval"] == full["eval"]


def test_readable_but_changed_arrays_fail_the_checksum(full_run, tmp_path, capsys):
    # Valid files holding other numbers (here step 2's state under step 4's name) load
    # without complaint from orbax: only the stored checksum tells.
    data, full = full_run
    out = tmp_path / "run"
    _train(data, out, stop_after=4)
    shutil.rmtree(out / "checkpoints" / "4" / "state")
    shutil.copytree(out / "checkpoints" / "2" / "state", out / "checkpoints" / "4" / "state")
    resumed = _train(data, out)
    said = capsys.readouterr().out
    assert re.search(r"checkpoints/4 fails its checksum \(expected SHA-256 [0-9a-f]{16}…, "
                     r"got [0-9a-f]{16}…\)", said)
    assert "falling back to the checkpoint of step 2" in said
    _assert_same_state(full["state"], resumed["state"])


def test_when_no_checkpoint_verifies_the_run_stops_and_moves_nothing(vocabulary, tmp_path):
    data = _data(vocabulary)
    out = tmp_path / "run"
    _train(data, out, stop_after=4)
    before = _files(out)
    for step in ("2", "4"):
        with open(_largest_state_file(out / "checkpoints" / step), "wb") as f:
            f.write(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="no checkpoint verifies; nothing was moved"):
        _train(data, out)
    assert _files(out) == before


def test_a_damaged_state_fails_before_orbax_reads_it_and_leaves_no_read_running(vocabulary, tmp_path,
                                                                               monkeypatch):
    # orbax reads all arrays at once on an event loop it closes when one read fails; the
    # reads left running then call the closed loop from tensorstore's threads ("Event
    # loop is closed", an exception ignored). The damage must be found before that.
    import asyncio

    from ntl_jax.train.checkpoint import Checkpointer, DamagedCheckpoint

    data = _data(vocabulary)
    out = tmp_path / "run"
    stopped = _train(data, out, stop_after=2)
    step_dir = out / "checkpoints" / "2"
    for target, offset in _where_stored(step_dir, stopped["state"]):
        with open(target, "r+b") as f:
            f.seek(offset)
            f.write(bytes(b ^ 0xFF for b in f.read(400)))
    left_running = []
    close = asyncio.BaseEventLoop.close

    def close_and_record(loop):
        left_running.extend(task for task in asyncio.all_tasks(loop) if not task.done())
        close(loop)

    monkeypatch.setattr(asyncio.BaseEventLoop, "close", close_and_record)
    checkpointer = Checkpointer(str(out / "checkpoints"))
    try:
        identity = micro_config(data, steps=6, seed=1, warmup_steps=1, checkpoint_every=2).identity()
        with pytest.raises(DamagedCheckpoint, match="is damaged or does not match this model"):
            checkpointer.restore(2, stopped["state"], identity)
    finally:
        checkpointer.close()
    assert left_running == []


def test_the_checksum_sees_one_changed_value_and_a_changed_shape():
    from ntl_jax.train.checkpoint import state_checksum

    state = {"w": np.arange(6, dtype=np.float32), "step": np.int32(3)}
    changed = {"w": np.arange(6, dtype=np.float32), "step": np.int32(3)}
    changed["w"][2] = np.nextafter(np.float32(2), np.float32(3))
    assert state_checksum(state) == state_checksum(
        {"w": np.arange(6, dtype=np.float32), "step": np.int32(3)})
    assert state_checksum(state) != state_checksum(changed)
    assert state_checksum(state) != state_checksum({"w": state["w"].reshape(2, 3),
                                                    "step": state["step"]})


def test_a_checkpoint_beyond_steps_is_rejected(vocabulary, tmp_path):
    data = _data(vocabulary)
    out = tmp_path / "run"
    _train(data, out, stop_after=4)
    os.rename(out / "checkpoints" / "4", out / "checkpoints" / "999")
    with pytest.raises(CheckpointError, match=r"is at step 999, beyond this run's 6 steps"):
        _train(data, out)
    assert (out / "checkpoints" / "999").is_dir()
    assert not (out / "results.json").exists()


def test_one_run_per_directory(vocabulary, tmp_path):
    data = _data(vocabulary)
    out = tmp_path / "run"
    out.mkdir()
    # The holder locks <out>/.lock as a run does (flock) and writes its PID into it.
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out / ".lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"another process \\(PID {holder.pid}\\) is "
                                             "training in .*expected one run per --out"):
            _train(data, out)
        assert not (out / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The holder is gone, and the kernel released its lock: the next run takes it over and
    # removes the file when it is done.
    result = _train(data, out)
    assert result["step"] == 6 and not (out / ".lock").exists()


def test_a_torn_last_log_line_is_dropped_on_resume(full_run, tmp_path, capsys):
    data, full = full_run
    out = tmp_path / "run"
    _train(data, out, stop_after=4)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "train/cross_entr')  # killed while writing
    resumed = _train(data, out)
    assert "dropped a partial last line" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert steps == [json.loads(line)["step"]
                     for line in open(tmp_path / "full" / "metrics.jsonl")]
    assert resumed["eval"] == full["eval"]


def test_a_damaged_line_inside_the_log_is_an_error(vocabulary, tmp_path):
    data = _data(vocabulary)
    out = tmp_path / "run"
    _train(data, out, stop_after=4)
    lines = open(out / "metrics.jsonl").read().splitlines()
    lines[0] = lines[0][:20]
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 1: expected a JSON record"):
        _train(data, out)
