"""Metrics sinks: TensorBoard events without TensorFlow, and runs without tensorboard."""

import glob
import json
import os
import subprocess
import sys

import pytest

from ntl_jax.train import logging_utils


def _events(out):
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    (path,) = glob.glob(os.path.join(out, "tensorboard", "events.out.tfevents.*"))
    return [event_pb2.Event.FromString(r) for r in event_file_loader.RawEventFileLoader(path).Load()]


def test_tensorboard_events_are_readable(tmp_path):
    pytest.importorskip("tensorboard")
    log = logging_utils.MetricsLog(str(tmp_path))
    log.write(1, {"train/loss": 2.5, "note": "text is not a scalar"})
    log.write(2, {"train/loss": 1.5})
    log.close()
    events = _events(str(tmp_path))
    assert events[0].file_version == "brain.Event:2"
    scalars = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
    assert scalars == [(1, "train/loss", 2.5), (2, "train/loss", 1.5)]
    assert logging_utils.read_metrics(log.path)[0]["note"] == "text is not a scalar"


def test_resume_marks_a_restart_and_truncates(tmp_path):
    pytest.importorskip("tensorboard")
    log = logging_utils.MetricsLog(str(tmp_path), tensorboard=False)
    for s in (1, 2, 3):
        log.write(s, {"x": float(s)})
    log.close()
    for f in glob.glob(str(tmp_path / "tensorboard" / "*")):
        os.remove(f)
    log = logging_utils.MetricsLog(str(tmp_path), resume_step=2)
    log.close()
    assert [r["step"] for r in logging_utils.read_metrics(log.path)] == [1, 2]
    (start,) = [e for e in _events(str(tmp_path)) if e.HasField("session_log")]
    assert start.step == 3


def test_writing_events_imports_no_tensorflow(tmp_path):
    pytest.importorskip("tensorboard")
    code = ("import sys; from ntl_jax.train.logging_utils import MetricsLog; "
            "log = MetricsLog(sys.argv[1]); log.write(1, {'a': 1.0}); log.close(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_without_tensorboard_only_the_json_file(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m.split(".")[0] == "tensorboard"] + ["tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)  # import tensorboard... -> ImportError
    log = logging_utils.MetricsLog(str(tmp_path))
    log.write(1, {"train/loss": 2.5})
    log.close()
    assert "tensorboard is not installed" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "tensorboard")
    assert json.loads(open(log.path).read()) == {"step": 1, "train/loss": 2.5}
