"""Metrics sinks: a JSON-lines file and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from typing import Any


def finite_or_none(tree: Any) -> Any:
    """`tree` with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(tree, dict):
        return {k: finite_or_none(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [finite_or_none(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree


def write_json(path: str, obj: Any) -> None:
    """Strict JSON (NaN and inf become null), written to a temporary file and renamed."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(finite_or_none(obj), f, indent=2, allow_nan=False, default=str)
    os.replace(tmp, path)


class _EventFile:
    """A TensorBoard event file written with the `tensorboard` package's protos and
    record format only. (Its `EventFileWriter` goes through `tensorboard.compat.tf`,
    which imports all of TensorFlow when TensorFlow is installed: seconds of start-up.)"""

    def __init__(self, log_dir: str):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        os.makedirs(log_dir, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self.event_pb2 = event_pb2
        self._file = open(os.path.join(log_dir, name), "wb")
        self._records = RecordWriter(self._file)
        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_event(self, event) -> None:
        self._records.write(event.SerializeToString())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricsLog:
    """Appends `{"step": s, ...}` records to `<out>/metrics.jsonl` and TensorBoard.

    On resume from step `s`, records after `s` (written by the interrupted run after its
    last checkpoint) are dropped from the JSON file, and TensorBoard is told to discard
    its own (a `SessionLog.START` at `s + 1`), so both read like one uninterrupted run.
    Without the `tensorboard` package only the JSON file is written.
    """

    def __init__(self, out_dir: str, resume_step: int | None = None, tensorboard: bool = True):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        if resume_step is None:
            open(self.path, "w").close()
        else:
            self._truncate_after(resume_step)
        self._tb = None
        if tensorboard:
            try:
                self._tb = _EventFile(os.path.join(out_dir, "tensorboard"))
            except ImportError:
                print("tensorboard is not installed: writing no TensorBoard events "
                      f"(metrics go to {self.path})", flush=True)
        if self._tb is not None and resume_step is not None:
            event_pb2 = self._tb.event_pb2
            self._tb.add_event(event_pb2.Event(
                wall_time=time.time(), step=resume_step + 1,
                session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = [line for line in f.read().split("\n") if line.strip()]
        kept = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                if number < len(lines):
                    raise ValueError(f"{self.path}, line {number}: expected a JSON record, got "
                                     f"{line[:80]!r}") from None
                print(f"{self.path}: dropped a partial last line (the run was stopped while "
                      "writing it)", flush=True)
                continue
            if record["step"] <= step:
                kept.append(line + "\n")
        with open(self.path, "w") as f:
            f.writelines(kept)

    def write(self, step: int, values: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(finite_or_none({"step": int(step), **values}),
                               allow_nan=False) + "\n")
        if self._tb is not None:
            from tensorboard.compat.proto import summary_pb2

            summary = summary_pb2.Summary(value=[
                summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                for k, v in values.items() if isinstance(v, (int, float))])
            self._tb.add_event(self._tb.event_pb2.Event(wall_time=time.time(), step=int(step),
                                                     summary=summary))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str) -> list[dict]:
    """The records of a `metrics.jsonl` file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
