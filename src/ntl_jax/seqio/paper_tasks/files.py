"""Reading a dataset's own files for the SeqIO tasks: where they are, line by line, and a
clear error naming the file and the line when one is absent or malformed.

Nothing is downloaded: the files are where the user put them, in a directory given to
`register(data_dir=...)` or by the dataset's environment variable.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

import seqio
import tensorflow as tf


def resolve_dir(data_dir: str | None, env: str) -> str | None:
    """`data_dir`, else the environment variable `env` (None when neither is set)."""
    return data_dir or os.environ.get(env) or None


def find_file(data_dir: str | None, candidates: Sequence[str], *, env: str, source: str) -> str:
    """The first of `candidates` (names relative to `data_dir`) that exists.

    Raises FileNotFoundError naming the directory, the files looked for, the environment
    variable and where the files come from (`source`).
    """
    if not data_dir:
        raise FileNotFoundError(
            f"expected the data directory in ${env} or register(data_dir=...), got neither; "
            f"it should hold {' or '.join(candidates)} ({source})")
    for name in candidates:
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"expected {' or '.join(candidates)} in {data_dir} (${env}), found none; {source}")


def lines(path: str) -> Iterator[tuple[int, str]]:
    """`(line number from 1, line without its newline)` of a UTF-8 text file, gzip'd when
    its name ends in `.gz`; blank lines skipped."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield number, line


def json_lines(path: str, fields: Mapping[str, type]) -> Iterator[tuple[int, dict[str, Any]]]:
    """`(line number, object)` of a JSONL file, each object checked to carry `fields`
    with their types; a ValueError names the file and line of the first that does not."""
    for number, line in lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: expected a JSON object, got {line[:80]!r} ({e})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        for key, kind in fields.items():
            if not isinstance(record.get(key), kind):
                got = "nothing" if key not in record else f"{type(record[key]).__name__} {record[key]!r:.80}"
                raise ValueError(f"{path}:{number}: expected {key!r} as {kind.__name__}, got {got}")
        yield number, record


def function_source(splits: Sequence[str], path_of: Callable[[str], str],
                    read: Callable[[str], Iterator[dict[str, Any]]],
                    signature: Mapping[str, tf.TensorSpec]) -> seqio.FunctionDataSource:
    """A SeqIO source streaming `read(path)`'s examples, the file of a split being
    `path_of(split)`: looked for (and a missing one reported) when the split is read, not
    when the task is registered, so tasks register without their data."""

    def dataset_fn(split: str, shuffle_files: bool, seed=None) -> tf.data.Dataset:
        del shuffle_files, seed  # one file per split: the task's shuffle buffer shuffles
        if split not in splits:
            raise ValueError(f"expected a split in {list(splits)}, got {split!r}")
        path = path_of(split)
        return tf.data.Dataset.from_generator(lambda: read(path), output_signature=dict(signature))

    return seqio.FunctionDataSource(dataset_fn, splits=list(splits))


def question_answer(ds: tf.data.Dataset) -> tf.data.Dataset:
    """SeqIO preprocessor: `question` and `answer` become `inputs` and `targets` (other
    fields are kept, for the metrics)."""
    def rename(ex):
        ex = dict(ex)
        ex["inputs"], ex["targets"] = ex.pop("question"), ex.pop("answer")
        return ex
    return ds.map(rename, num_parallel_calls=tf.data.AUTOTUNE)


def strip(text, example=None, is_target=False):
    """SeqIO postprocessor: decoded text without surrounding whitespace."""
    del example, is_target
    return text.strip() if isinstance(text, str) else text


def add_task(name: str, source: seqio.DataSource, preprocessors: Sequence[Callable], *,
             byte: bool, postprocess_fn: Callable, metric_fns: Sequence[Callable]) -> str:
    """Registers (or re-registers) `name` with ntl_jax's features and returns it."""
    from ntl_jax.seqio import vocabularies

    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name, source=source,
        preprocessors=[*preprocessors, seqio.preprocessors.tokenize,
                       seqio.preprocessors.append_eos_after_trim],
        output_features=vocabularies.output_features(byte),
        postprocess_fn=postprocess_fn, metric_fns=list(metric_fns),
        shuffle_buffer_size=10_000)
    return name
