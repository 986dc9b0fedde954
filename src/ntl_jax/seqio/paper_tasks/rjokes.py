"""rJokes (Weller & Seppi, LREC 2020) as SeqIO tasks: a joke from Reddit's r/Jokes in, its
score (the natural log of its upvotes, truncated to a whole number: 0 to 11) out; the
paper's regression-from-text task.

Tasks `ntl_rjokes` (the shipped SentencePiece vocabulary) and `ntl_rjokes_byte`
(`seqio.ByteVocabulary`), splits `train` (345,965 jokes), `validation` (43,246) and
`test` (43,246), read from the dataset's files `train.tsv`, `dev.tsv` and `test.tsv`
(github.com/orionw/rJokesData, `data/`, released gzip'd as `*.tsv.gz`, which are read as
they are) in `$NTL_JAX_RJOKES_DIR` or `register(data_dir=...)`. Each line is the score,
a tab, and the joke (title and body on one line). To fine-tune a checkpoint with its own
vocabulary, take a copy of the task on it (`ntl_jax.t5x.task_variants.with_vocabulary`).

Inputs and targets follow the paper's code (tum-ai/number-token-loss,
`data/rjokes-dataset/generate_dataset.py`): the line is stripped and split at its first
tab; `inputs` is the joke as written (with the release's `\\` escapes, such as a tab
written `\\<tab>`, kept), `targets` the score as written (`"0"` ... `"11"`). Where we
differ: the paper silently drops a line without a tab (or with nothing after it); we raise
a ValueError naming the file and line, as we do for a score that is not a whole number
(the release has neither).

Metrics (`ntl_jax.data.metrics.regression_metrics`, on the last number of each decoded
prediction): `rmse`, `pearson_r` and `parsed` (the share of predictions with a number).

The paper compares, on rJokes, a language model's token head trained with NTL against a
dedicated regression head. Here T5X runs the token-head side (these tasks with CE,
NTL-WAS or NTL-MSE); the regression head (the encoder's mean-pooled output into one
number) exists only in ntl_jax's single-machine trainer (`ntl_jax/train/regression_head.py`,
`--loss regression-head`), not in T5X.
"""

from __future__ import annotations

import re
from typing import Iterator

from ntl_jax.data.metrics import regression_metrics
from ntl_jax.seqio.paper_tasks import files

DATA_DIR_ENV = "NTL_JAX_RJOKES_DIR"
SOURCE = ("the files are at github.com/orionw/rJokesData, data/{train,dev,test}.tsv.gz "
          "(read gzip'd or not)")
SPLIT_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
NAME = "ntl_rjokes"

_SCORE = re.compile(r"[0-9]+")
metrics = regression_metrics


def example(line: str) -> dict[str, str]:
    """`{"question": joke, "answer": score}` of one line, as the paper splits it (the
    line stripped, then split at its first tab); a ValueError says what is wrong.

    >>> example("11\\tA joke with\\\\\\ta tab, and a café.  \\n")
    {'question': 'A joke with\\\\\\ta tab, and a café.', 'answer': '11'}
    >>> example("3.5\\tA joke")
    Traceback (most recent call last):
    ...
    ValueError: expected a whole-number score (rJokes has 0 to 11) before the first tab, got '3.5'
    """
    parts = line.strip().split("\t", 1)
    if len(parts) != 2:  # also a line whose joke is empty: the strip takes its tab
        raise ValueError(f"expected '<score><tab><joke>', got {line[:80]!r} (no tab, or no joke after it)")
    score, text = parts
    if not _SCORE.fullmatch(score):
        raise ValueError(f"expected a whole-number score (rJokes has 0 to 11) before the first tab, "
                         f"got {score[:80]!r}")
    return {"question": text, "answer": score}


def read(path: str) -> Iterator[dict[str, str]]:
    """`{"question", "answer"}` of each line of an rJokes TSV file (gzip'd when its name
    ends in `.gz`); a ValueError names the file and line of a malformed one."""
    for number, line in files.lines(path):
        try:
            yield example(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None


def register(data_dir: str | None = None, *, name: str = NAME) -> list[str]:
    """(Re-)registers `name` and `name + "_byte"` on the files in `data_dir` (default
    `$NTL_JAX_RJOKES_DIR`, read when a split is first read); returns the names."""
    import tensorflow as tf

    data_dir = files.resolve_dir(data_dir, DATA_DIR_ENV)
    source = files.function_source(
        list(SPLIT_FILES),
        lambda split: files.find_file(data_dir, [SPLIT_FILES[split], SPLIT_FILES[split] + ".gz"],
                                      env=DATA_DIR_ENV, source=SOURCE),
        read,
        {"question": tf.TensorSpec((), tf.string), "answer": tf.TensorSpec((), tf.string)})
    return [files.add_task(name + suffix, source, [files.question_answer], byte=bool(suffix),
                           postprocess_fn=files.strip, metric_fns=[metrics])
            for suffix in ("", "_byte")]
