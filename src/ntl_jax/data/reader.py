"""Reader for the DeepMind mathematics release layout.

    <data_dir>/train-easy/<module>.txt     question and answer on alternating lines
    <data_dir>/train-medium/<module>.txt
    <data_dir>/train-hard/<module>.txt
    <data_dir>/interpolate/<module>.txt
    <data_dir>/extrapolate/<extrapolation module>.txt

Lines are paired inside each file, never across files, so a malformed file cannot
shift the pairs of another one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from ntl_jax.data import catalogue

LAYOUT = """\
  <data_dir>/train-easy/<module>.txt
  <data_dir>/train-medium/<module>.txt
  <data_dir>/train-hard/<module>.txt
  <data_dir>/interpolate/<module>.txt
  <data_dir>/extrapolate/<module>_big|_longer|_more.txt
each file holding a question line followed by its answer line, repeated"""


# What a byte that is not UTF-8 decodes to under errors="surrogateescape".
_BAD_BYTE = re.compile("[\udc80-\udcff]")


def generate_command(data_dir: str, modules: str = "all") -> str:
    """The command that writes the release layout under `data_dir`."""
    return f"ntl-jax generate --output-dir {data_dir} --modules {modules}"


def module_path(data_dir: str, regime: str, module: str) -> str:
    """Path of one release file."""
    if regime not in catalogue.REGIMES:
        raise ValueError(f"expected a regime in {catalogue.REGIMES}, got {regime!r}")
    return os.path.join(data_dir, regime, f"{module}.txt")


def check_files(data_dir: str, paths: list[str], modules: str = "all") -> None:
    """Raises FileNotFoundError naming the layout and the generate command if any of
    `paths` (or `data_dir` itself) is missing."""
    if not os.path.isdir(data_dir):
        missing = [data_dir]
    else:
        missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise FileNotFoundError(
            f"mathematics data not found: {shown}.\nExpected the DeepMind release layout:\n"
            f"{LAYOUT}\nWrite it offline with:\n  {generate_command(data_dir, modules)}\n"
            "or unset NTL_JAX_MATH_DIR to generate examples on the fly."
        )


def read_pairs(path: str) -> Iterator[tuple[str, str]]:
    """Yields `(question, answer)` from one release file.

    Raises:
      ValueError: naming the file and line, for a question without an answer (odd
        number of lines), an empty question or answer, or bytes that are not UTF-8.
    """
    # surrogateescape keeps reading past a bad byte, so the error can name its line.
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        question = None
        lineno = 0
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            bad = _BAD_BYTE.search(line)
            if bad:
                byte = ord(bad.group()) - 0xDC00
                raise ValueError(
                    f"{path}:{lineno}: not valid UTF-8 (byte 0x{byte:02x} at column {bad.start() + 1}); "
                    "expected UTF-8 text"
                )
            if lineno % 2:
                if not line.strip():
                    raise ValueError(f"{path}:{lineno}: empty question line")
                question = line
            else:
                if not line.strip():
                    raise ValueError(
                        f"{path}:{lineno}: empty answer for the question on line {lineno - 1}"
                    )
                yield question, line
        if lineno % 2:
            raise ValueError(
                f"{path}:{lineno}: question without an answer (odd number of lines, "
                f"{lineno}); expected question and answer lines alternating"
            )


def read_pairs_tf(path, skip: int = 0, take: int = -1):
    """`tf.data.Dataset` of `{"question", "answer"}` from one file (a string tensor).

    Args:
      path: scalar tf.string, the file.
      skip: pairs to drop from the start of the file.
      take: pairs to keep after that (-1: all).

    A malformed file stops iteration with `tf.errors.InvalidArgumentError` whose
    message names the file and line.
    """
    import tensorflow as tf

    pairs = tf.data.TextLineDataset(path).batch(2, drop_remainder=False).enumerate()

    def check(i, lines):
        q_line = tf.strings.as_string(2 * i + 1)
        a_line = tf.strings.as_string(2 * i + 2)
        n = tf.shape(lines)[0]
        odd = tf.debugging.Assert(
            tf.equal(n, 2),
            [tf.strings.join([path, ":", q_line, ": question without an answer (odd number of lines)"])],
        )
        with tf.control_dependencies([odd]):
            question, answer = lines[0], lines[-1]
        empty_q = tf.debugging.Assert(
            tf.strings.length(tf.strings.strip(question)) > 0,
            [tf.strings.join([path, ":", q_line, ": empty question line"])],
        )
        empty_a = tf.debugging.Assert(
            tf.strings.length(tf.strings.strip(answer)) > 0,
            [tf.strings.join([path, ":", a_line, ": empty answer"])],
        )
        with tf.control_dependencies([empty_q, empty_a]):
            return {"question": tf.identity(question), "answer": tf.identity(answer)}

    pairs = pairs.skip(skip).take(take)
    return pairs.map(check)
