"""GSM8K (Cobbe et al., 2021) as SeqIO tasks: grade-school word problems, answered with a
worked solution that ends in `#### <final answer>`; the paper's "scales to 3B" run.

Tasks `ntl_gsm8k` (the shipped SentencePiece vocabulary) and `ntl_gsm8k_byte`
(`seqio.ByteVocabulary`), splits `train` (7,473 problems) and `test` (1,319), read from
the official files `train.jsonl` and `test.jsonl` (github.com/openai/grade-school-math,
`grade_school_math/data/`; JSON lines with `question` and `answer`) in `$NTL_JAX_GSM8K_DIR`
or `register(data_dir=...)`. To fine-tune a checkpoint with its own vocabulary, take a
copy of the task on it (`ntl_jax.t5x.task_variants.with_vocabulary`).

Inputs and targets follow the paper's code (tum-ai/number-token-loss,
`data/grade-school-math/.../prepocess_data.py`): `inputs` is the question, `targets` the
whole worked solution, both through `preprocess_numbers` (thousands separators and
spaced digit groups joined, `.5` written `0.5`), so that a number is one digit run. Where
we differ: the paper's files are named `*_clean` and are not published; we take "clean"
to mean without GSM8K's calculator annotations (`<<48/2=24>>`), which are removed
(`register(calculator_annotations=True)` keeps them); the paper holds out a validation
split of its own making, which we do not have (evaluate on `test`, as the paper reports);
and `preprocess_numbers` rewrites each match where it stands, where the paper's
`str.replace` also rewrote equal text elsewhere (`3.5` became `30.5` next to a `.5`).
The paper's rule joins a number and a following group of three digits however they are
spaced, so it also joins two numbers that only stand side by side: "12 200-kilobyte
videos" (train #1365) becomes "12200-kilobyte videos". We keep the rule, as the paper's
numbers are written by it.

Metrics (`metrics`, on the final answer after the last `####`): `accuracy` (the final
number equals the target's), `parsed` (share of predictions with a final number), and
`log_mae` / `mae` over those that parse.
"""

from __future__ import annotations

import math
import re
from typing import Iterator, Sequence

import numpy as np

from ntl_jax.seqio.paper_tasks import files

DATA_DIR_ENV = "NTL_JAX_GSM8K_DIR"
SOURCE = ("the official files are at github.com/openai/grade-school-math, "
          "grade_school_math/data/{train,test}.jsonl")
SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}
NAME = "ntl_gsm8k"

_CALCULATOR = re.compile(r"<<[^<>]*>>")
# The paper's three patterns (prepocess_data.py), each rewritten where it matches.
_SPACED_GROUPS = re.compile(r"(^|\s)(\d{1,3}(?: \d{3})+(?:\.\d+)?)")
_COMMA_GROUPS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_BARE_DECIMAL = re.compile(r"(\D|^)(\.\d+)")
_FINAL = re.compile(r"([-+]?)\s*\$?\s*([-+]?)\s*(\d[\d,]*(?:\.\d+)?|\.\d+)")


def preprocess_numbers(text: str) -> str:
    """The paper's number normalisation: `1 000 000` and `1,000,000` become `1000000`,
    and `.5` becomes `0.5`.

    >>> preprocess_numbers("He paid $1,250.50 for 2 000 pens, .5 each; 3.5 left")
    'He paid $1250.50 for 2000 pens, 0.5 each; 3.5 left'
    """
    text = _SPACED_GROUPS.sub(lambda m: m.group(1) + m.group(2).replace(" ", ""), text)
    text = _COMMA_GROUPS.sub(lambda m: m.group(0).replace(",", ""), text)
    return _BARE_DECIMAL.sub(lambda m: m.group(1) + "0" + m.group(2), text)


def target(answer: str, calculator_annotations: bool = False) -> str:
    """The target text of a GSM8K `answer`: calculator annotations removed (unless
    kept), then `preprocess_numbers`.

    >>> target("She has 48/2 = <<48/2=24>>24 left.\\n#### 1,024")
    'She has 48/2 = 24 left.\\n#### 1024'
    """
    if not calculator_annotations:
        answer = _CALCULATOR.sub("", answer)
    return preprocess_numbers(answer)


def final_answer(text) -> float:
    """The number after the last `####` of `text` (NaN if there is none): signs, a `$`,
    thousands separators and a trailing `.` allowed.

    >>> [final_answer(s) for s in ["... #### 1,234", "#### $5.50", "#### -3", "#### 7.", "x 12"]]
    [1234.0, 5.5, -3.0, 7.0, nan]
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"expected a string, got {type(text).__name__}")
    _, mark, tail = text.rpartition("####")
    if not mark:
        return math.nan
    m = _FINAL.match(tail.strip())
    if not m:
        return math.nan
    negative = (m.group(1) == "-") != (m.group(2) == "-")
    digits = m.group(3)
    if "," in digits and not re.fullmatch(r"\d{1,3}(?:,\d{3})*(?:\.\d+)?", digits):
        return math.nan  # commas that are not thousands separators: not a number
    value = float(digits.replace(",", ""))
    return -value if negative else value


def metrics(targets: Sequence, predictions: Sequence) -> dict[str, float]:
    """seqio metric fn on the final answers: `accuracy` (equal as numbers; a prediction
    without one is wrong), `parsed`, and `mae`, `log_mae` (on `sign(x) log10(|x| + 1)`)
    over the parsed ones (NaN when none parse).

    >>> m = metrics(["#### 72", "#### 10", "#### 5"], ["#### 72.", "#### 1,000", "no answer"])
    >>> m["accuracy"], m["parsed"], m["mae"]
    (0.3333333333333333, 0.6666666666666666, 495.0)
    """
    from ntl_jax.data.metrics import signed_log10

    if len(targets) != len(predictions):
        raise ValueError(f"expected as many predictions as targets, got {len(predictions)} "
                         f"predictions for {len(targets)} targets")
    if not len(targets):
        return {"accuracy": math.nan, "parsed": math.nan, "mae": math.nan, "log_mae": math.nan}
    t = np.array([final_answer(x) for x in targets], np.float64)
    if np.isnan(t).any():
        bad = targets[int(np.flatnonzero(np.isnan(t))[0])]
        raise ValueError(f"expected every target to end in '#### <number>', got {bad!r:.200}")
    p = np.array([final_answer(x) for x in predictions], np.float64)
    ok = ~np.isnan(p)
    err = np.abs(p[ok] - t[ok])
    log_err = np.abs(signed_log10(p[ok]) - signed_log10(t[ok]))
    return {
        "accuracy": float(np.mean(p == t)),
        "parsed": float(np.mean(ok)),
        "mae": float(err.mean()) if ok.any() else math.nan,
        "log_mae": float(log_err.mean()) if ok.any() else math.nan,
    }


def read(path: str, calculator_annotations: bool = False) -> Iterator[dict[str, str]]:
    """`{"question", "answer"}` of each line of a GSM8K JSONL file, preprocessed as the
    task's inputs and targets; a ValueError names the file and line of a malformed one."""
    for number, record in files.json_lines(path, {"question": str, "answer": str}):
        if not np.isfinite(final_answer(record["answer"])):
            raise ValueError(f"{path}:{number}: expected an answer ending in '#### <number>', "
                             f"got {record['answer'][-80:]!r}")
        yield {"question": preprocess_numbers(record["question"]),
               "answer": target(record["answer"], calculator_annotations)}


def register(data_dir: str | None = None, *, calculator_annotations: bool = False,
             name: str = NAME) -> list[str]:
    """(Re-)registers `name` and `name + "_byte"` on the files in `data_dir` (default
    `$NTL_JAX_GSM8K_DIR`, read when a split is first read); returns the names."""
    import tensorflow as tf

    data_dir = files.resolve_dir(data_dir, DATA_DIR_ENV)
    source = files.function_source(
        list(SPLIT_FILES),
        lambda split: files.find_file(data_dir, [SPLIT_FILES[split]], env=DATA_DIR_ENV, source=SOURCE),
        lambda path: read(path, calculator_annotations),
        {"question": tf.TensorSpec((), tf.string), "answer": tf.TensorSpec((), tf.string)})
    return [files.add_task(name + suffix, source, [files.question_answer], byte=bool(suffix),
                           postprocess_fn=files.strip, metric_fns=[metrics])
            for suffix in ("", "_byte")]
