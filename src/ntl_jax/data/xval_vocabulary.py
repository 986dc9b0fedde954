"""xVal's text codec: every number of a text as one `[NUM]` token and its value.

`XvalVocabulary` wraps a digit-split vocabulary (the shipped one): `encode(text)` gives
the ids with each number as `[NUM]` (id `vocab_size` of the base) and the numbers'
values; `decode(ids, values)` writes each `[NUM]` as its value (2 decimals, trailing
zeros dropped). Numbers are the matches of `-?[0-9]+(\\.[0-9]+)?`: a leading "-" belongs
to the number, so "5 - 3" keeps its operator but "-3" is one number (and "5-3", without
spaces, reads as 5 and -3; the mathematics generator spaces its binary operators).
The trainer's xVal (`ntl_jax.train.xval`) and SeqIO's (`ntl_jax.seqio.xval.xval_vocabulary()`)
use it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ntl_jax.data.metrics import format_prediction
from ntl_jax.data.number_scaling import scale_values

EOS_ID = 1  # T5's, and the shipped vocabulary's
NUM_TOKEN = "[NUM]"
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_PLACEHOLDER = "0"  # a digit: its own token in a digit-split vocabulary, absent from number-free text
_CACHE_LIMIT = 1 << 18


def extract_numbers(text: str, placeholder: str = NUM_TOKEN) -> tuple[str, list[float]]:
    """`text` with each number replaced by `placeholder`, and the numbers in order.

    >>> extract_numbers("What is -4 + 2.5 - 3?")
    ('What is [NUM] + [NUM] - [NUM]?', [-4.0, 2.5, 3.0])
    """
    values: list[float] = []

    def replace(match):
        values.append(float(match.group()))
        return placeholder

    return NUMBER.sub(replace, text), values


class XvalVocabulary:
    """A digit-level vocabulary with xVal's `[NUM]` token (id `vocabulary.vocab_size`).

    `encode(text)` gives the ids of `text` with each number as `[NUM]` and the numbers'
    values (NaN at the other ids); `decode(ids, values)` writes each `[NUM]` as its value.
    A number is encoded as the text with the number replaced by the digit "0", whose
    token then becomes `[NUM]`: the surrounding text is tokenized as it is in context.
    """

    def __init__(self, vocabulary: Any):
        self.vocabulary = vocabulary
        self.vocab_size = int(vocabulary.vocab_size)
        self.num_id = self.vocab_size
        ids = list(vocabulary.encode(_PLACEHOLDER))
        self._placeholder = ids[-1] if ids else -1
        if not ids or vocabulary.decode([self._placeholder]) != _PLACEHOLDER:
            raise ValueError(f"xVal expected a digit-split vocabulary with a token for '0', got ids {ids} "
                             f"for '0' from {vocabulary!r}")
        self._cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def encode(self, text: str) -> tuple[list[int], np.ndarray]:
        """`(ids, values)`: `ids` with `num_id` for each number, `values` float64 of the
        same length, the number at its `[NUM]` and NaN elsewhere (no EOS added)."""
        masked, numbers = extract_numbers(text, _PLACEHOLDER)
        ids = list(self.vocabulary.encode(masked))
        where = [k for k, i in enumerate(ids) if i == self._placeholder]
        if len(where) != len(numbers):
            raise ValueError(f"xVal expected one '0' token per number of {text!r} ({len(numbers)}), got "
                             f"{len(where)}: the vocabulary must keep digits as tokens of their own")
        values = np.full(len(ids), np.nan)
        for k, v in zip(where, numbers):
            ids[k] = self.num_id
            values[k] = v
        return ids, values

    def decode(self, ids, values) -> str:
        """The text of `ids` up to the first EOS, each `[NUM]` written as its value
        (`values`, same length, in the answers' scale) by `format_value`."""
        parts: list[str] = []
        segment: list[int] = []

        def flush():
            if segment:
                text = self.vocabulary.decode(segment)
                # A piece's leading "▁" is a space, which decoding drops at the start.
                if parts and self._leading_space(segment[0]):
                    text = " " + text
                parts.append(text)
                segment.clear()

        for i, v in zip(np.asarray(ids).tolist(), np.asarray(values, np.float64).tolist()):
            if i == EOS_ID:
                break
            if i == self.num_id:
                flush()
                parts.append(format_value(v))
            elif i > 0:
                segment.append(i)
        flush()
        return "".join(parts).strip()

    def _leading_space(self, i: int) -> bool:
        return 0 <= i < self.vocab_size and str(self.vocabulary.id_to_piece(i)).startswith("\u2581")

    def _convert_row(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = row.tobytes()
        hit = self._cache.get(key)
        if hit is None:
            ids = row.tolist()
            if EOS_ID in ids:
                ids = ids[: ids.index(EOS_ID)]
            new_ids, values = self.encode(self.vocabulary.decode([i for i in ids if i > 0]))
            hit = (np.array(new_ids + [EOS_ID], np.int32), np.append(values, np.nan))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def convert(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, values)` `[B, L']` of `[B, L]` digit-vocabulary rows (0-padded, EOS at
        the end): each row decoded to text and re-encoded, values NaN except at `[NUM]`.
        `L'` is `L` unless a row grew (not seen with the shipped vocabulary, where a
        number's digits become one token), then the longest row rounded up to 8."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"expected [batch, length] token ids, got shape {tokens.shape}")
        rows = [self._convert_row(row) for row in tokens]
        need = max((len(ids) for ids, _ in rows), default=0)
        length = tokens.shape[1] if need <= tokens.shape[1] else -(-need // 8) * 8
        ids = np.zeros((len(rows), length), np.int32)
        values = np.full((len(rows), length), np.nan)
        for k, (row_ids, row_values) in enumerate(rows):
            ids[k, : len(row_ids)] = row_ids
            values[k, : len(row_values)] = row_values
        return ids, values


def format_value(value: float) -> str:
    """A predicted number as text: the regression head's format (2 decimals).

    >>> format_value(11.996), format_value(-3.0)
    ('12', '-3')
    """
    return format_prediction(value)


def embedding_scale(ids: np.ndarray, values: np.ndarray, num_id: int) -> np.ndarray:
    """`[B, L]` float32 multipliers: the scaled value at `[NUM]`, 1 elsewhere."""
    is_num = np.asarray(ids) == num_id
    return np.where(is_num, scale_values(np.where(is_num, values, 0.0)), 1.0).astype(np.float32)


