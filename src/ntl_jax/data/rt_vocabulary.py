"""The Regression Transformer's number tokens: the paper's RT baseline ("rt", "rt+ntl-mse").

The Regression Transformer (Born & Manica, Nature Machine Intelligence 2023) writes each
digit of a number as one token that carries its decimal place, `_d_p_` (the digit d
times 10^p): 12.5 is `_1_1_ _2_0_ _5_-1_`. The paper trains it with cross-entropy ("rt")
and with CE + NTL-MSE ("rt+ntl-mse", the authors' `rt_ntl`). `RtVocabulary` is the
shipped SentencePiece vocabulary (`ntl_jax.data.vocabulary.default_vocabulary()`) with the RT
pieces of `vocab_assets/rt_number_tokens.txt` (`scripts/make_rt_vocab.py`) appended
after its ids; everything but numbers is tokenized as before. The trainer's RT systems
and SeqIO (`ntl_jax.seqio.rt_vocabulary()`) use the same ids.

Conventions, those of the authors' `rt_tokenizer.py` unless said otherwise:

* A number is a run of ASCII digits with an optional fraction, `[0-9]+(\\.[0-9]+)?`,
  found in the base vocabulary's tokens (which split every digit off). The sign is not
  part of it: "-" stays a token of the base vocabulary, so "-12.5" is `▁-` then the
  three RT tokens above. No plain digit token is left in an encoded text.
* Digits are kept as written: "07" is `_0_1_ _7_0_` and "1.50" ends in `_0_-2_`, so
  `decode(encode(text)) == text`. (The authors first round to 12 decimals and drop
  leading zeros and trailing decimal zeros.)
* Places run from `max_place` down to `min_place` (31..-23 in the shipped file, the
  authors' 12..-12 is too narrow for the arithmetic modules' extrapolation sets): a
  number with a digit outside them makes `encode` raise ValueError, never a wrong token.
* Decoding: consecutive RT tokens whose places decrease form one number, with value
  sum d * 10^p; a token whose place is not below the previous one starts a new number,
  written after a space (as the authors do). A number is written from its highest
  place (or 0) down to place 0 (or its lowest), missing places as 0: a malformed
  `_1_2_ _5_0_` reads "105".
* NTL: the value of `_d_p_` is its digit d whatever its place (the authors'
  `ignore_order=True`), so NTL-MSE regresses each digit on the 10 * places RT tokens.
  The base vocabulary's own digit pieces "0".."9" are not number tokens, since RT never
  emits them. RT tokens write no plain digits (`digit_counts` 0) and there is no
  decimal-point token in an RT number: the number-level losses would read each RT token
  as a number of its own, so the RT systems train "ce" and "ntl-mse" only.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable

import numpy as np

from ntl_jax.data.vocabulary import ASSETS_DIR

PIECES_PATH = os.path.join(ASSETS_DIR, "rt_number_tokens.txt")
_PIECE = re.compile(r"_([0-9])_(-?[0-9]+)_")


def read_pieces(path: str = PIECES_PATH) -> tuple[list[str], int, int]:
    """`(pieces, max_place, min_place)` of an RT pieces file, checked to be the layout
    `scripts/make_rt_vocab.py` writes (`_d_p_`, places decreasing, digits 0..9 each)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    first = _PIECE.fullmatch(lines[0]) if lines else None
    last = _PIECE.fullmatch(lines[-1]) if lines else None
    if first is None or last is None:
        raise ValueError(f"{path}: expected lines '_d_p_' (digit d, place p), got "
                         f"{(lines[0] if lines else '')!r} ... {(lines[-1] if lines else '')!r}")
    max_place, min_place = int(first.group(2)), int(last.group(2))
    if not max_place >= 0 >= min_place:
        raise ValueError(f"{path}: expected places from >= 0 down to <= 0, got {max_place}..{min_place}")
    expected = [f"_{d}_{p}_" for p in range(max_place, min_place - 1, -1) for d in range(10)]
    for number, (got, want) in enumerate(zip(lines, expected), start=1):
        if got != want:
            raise ValueError(f"{path}, line {number}: expected {want!r}, got {got!r}")
    if len(lines) != len(expected):
        raise ValueError(f"{path}: expected {len(expected)} lines for places {max_place}..{min_place}, "
                         f"got {len(lines)}")
    return lines, max_place, min_place


class RtVocabulary:
    """A base vocabulary with the RT pieces appended: `encode`, `decode`, `vocab_size`,
    `id_to_piece`, `number_tokens()` (see the module docstring).

    Ids below the base vocabulary's size are the base's (pad 0, EOS 1 unchanged); RT
    piece `k` of the pieces file has id `base.vocab_size + k`.

    >>> v = vocabulary()
    >>> [v.id_to_piece(i) for i in v.encode("-12.5")]
    ['▁-', '_1_1_', '_2_0_', '_5_-1_']
    >>> v.decode(v.encode("-12.5")), v.vocab_size
    ('-12.5', 1550)
    """

    system_vocabulary = "rt"  # the name the trainer knows this vocabulary by

    def __init__(self, base: Any = None, pieces_path: str = PIECES_PATH):
        if base is None:
            from ntl_jax.data.vocabulary import default_vocabulary

            base = default_vocabulary()
        self.base = base
        self.pieces_path = os.fspath(pieces_path)
        self.pieces, self.max_place, self.min_place = read_pieces(self.pieces_path)
        self._tables = None
        self._number_tokens = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r}, places {self.max_place}..{self.min_place})"

    def __getstate__(self):  # the tables are rebuilt on first use
        return self.__dict__ | {"_tables": None, "_number_tokens": None}

    # ---- the id tables (built on first use: they need the base's pieces) ----------------
    def _base_ids(self) -> dict:
        """The base's ids of the ten digit pieces, "." and the space "▁"; checks that it
        writes every digit as a token of its own."""
        size = int(self.base.vocab_size)
        pieces = [self.base.id_to_piece(i) for i in range(size)]
        wanted = [str(d) for d in range(10)] + [".", "▁"]
        ids = {p: pieces.index(p) for p in wanted if p in pieces}
        missing = [p for p in wanted if p not in ids]
        byte_piece = re.compile(r"<0x[0-9A-F]{2}>")
        merged = [p for p in pieces if re.search("[0-9]", p) and len(p) > 1 and not byte_piece.fullmatch(p)]
        if missing or merged:
            raise ValueError(f"expected a base vocabulary with the pieces '0'..'9', '.' and '▁' and no other "
                             f"piece holding a digit (digits split off), got missing {missing}, pieces with "
                             f"digits {merged[:5]}")
        return {"size": size, "digit_ids": np.array([ids[str(d)] for d in range(10)]), "dot": ids["."],
                "space": ids["▁"]}

    @property
    def tables(self) -> dict:
        """The base's digit, "." and "▁" ids and its size (read once, on first use)."""
        if self._tables is None:
            t = self._base_ids()
            t["digit_of_base_id"] = {int(i): d for d, i in enumerate(t["digit_ids"])}
            self._tables = t
        return self._tables

    @property
    def base_size(self) -> int:
        return self.tables["size"]

    @property
    def vocab_size(self) -> int:
        return self.base_size + len(self.pieces)

    @property
    def pad_id(self) -> int:
        return int(self.base.pad_id)

    @property
    def eos_id(self) -> int:
        return int(self.base.eos_id)

    @property
    def unk_id(self) -> int:
        return int(self.base.unk_id)

    def rt_id(self, digit: int, place: int) -> int:
        """The id of `_digit_place_` (places must be within the file's)."""
        return self.base_size + (self.max_place - place) * 10 + digit

    def digit_and_place(self, token_id: int) -> tuple[int, int]:
        """`(d, p)` of the RT token `token_id`."""
        k = int(token_id) - self.base_size
        if not 0 <= k < len(self.pieces):
            raise ValueError(f"expected an RT token id in [{self.base_size}, {self.vocab_size}), got {token_id}")
        return k % 10, self.max_place - k // 10

    def id_to_piece(self, i: int) -> str:
        """The base's piece below its size, else the RT piece (e.g. '_5_-1_')."""
        i = int(i)
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"expected a token id in [0, {self.vocab_size}), got {i}")
        return self.base.id_to_piece(i) if i < self.base_size else self.pieces[i - self.base_size]

    # ---- encoding ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """`text`'s ids: the base vocabulary's, every number's digits as RT tokens.

        Raises:
          ValueError: a number has a digit beyond the places of the pieces file.
        """
        ids = [int(i) for i in self.base.encode(text)]
        digit_of, dot = self.tables["digit_of_base_id"], self.tables["dot"]
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            if ids[i] not in digit_of:
                out.append(ids[i])
                i += 1
                continue
            j = i
            while j < n and ids[j] in digit_of:
                j += 1
            whole, fraction = ids[i:j], []
            if j + 1 < n and ids[j] == dot and ids[j + 1] in digit_of:
                k = j + 1
                while k < n and ids[k] in digit_of:
                    k += 1
                fraction, j = ids[j + 1:k], k
            out += self._number_ids([digit_of[t] for t in whole], [digit_of[t] for t in fraction], text)
            i = j
        return out

    def _number_ids(self, whole: list[int], fraction: list[int], text: str) -> list[int]:
        top, bottom = len(whole) - 1, -len(fraction)
        if top > self.max_place or bottom < self.min_place:
            number = "".join(map(str, whole)) + ("." + "".join(map(str, fraction)) if fraction else "")
            raise ValueError(
                f"RT places run {self.max_place}..{self.min_place}: expected numbers of at most "
                f"{self.max_place + 1} integer digits and {-self.min_place} decimals, got {number} in "
                f"{text[:100]!r}; a wider range needs a new pieces file (scripts/make_rt_vocab.py)")
        places = range(top, bottom - 1, -1)
        return [self.rt_id(d, p) for d, p in zip(whole + fraction, places)]

    # ---- decoding ---------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` up to the first EOS: RT runs written as numbers, the rest as
        the base vocabulary decodes it (ids beyond the vocabulary as its unknown token)."""
        ids = np.asarray(ids).reshape(-1).tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        eos = self.eos_id
        if eos in ids:
            ids = ids[: ids.index(eos) + 1]
        base_size, size = self.base_size, self.vocab_size
        out: list[int] = []
        run: list[tuple[int, int]] = []
        for i in ids:
            if base_size <= i < size:
                digit, place = self.digit_and_place(i)
                if run and place >= run[-1][1]:  # a new number right after one: a space between
                    out += self._number_base_ids(run) + [self.tables["space"]]
                    run = []
                run.append((digit, place))
                continue
            if run:
                out += self._number_base_ids(run)
                run = []
            out.append(i if 0 <= i < base_size else self.unk_id)
        if run:
            out += self._number_base_ids(run)
        return self.base.decode(out)

    def _number_base_ids(self, run: list[tuple[int, int]]) -> list[int]:
        """The base's digit and "." ids writing the number of an RT run (places decreasing)."""
        digits = {p: d for d, p in run}
        high, low = max(run[0][1], 0), min(run[-1][1], 0)
        digit_ids = self.tables["digit_ids"]
        out = [int(digit_ids[digits.get(p, 0)]) for p in range(high, -1, -1)]
        if low < 0:
            out.append(self.tables["dot"])
            out += [int(digit_ids[digits.get(p, 0)]) for p in range(-1, low - 1, -1)]
        return out

    # ---- the authors' float encodings ---------------------------------------------------
    def float_encodings(self, emb_dim: int, rows: int | None = None) -> np.ndarray:
        """`[rows, emb_dim]` float32: the fixed vector the authors' RT adds to the input
        embedding of each token (`FloatEncoding` with `log_scale_embeddings`, V_MAX = 3e9).

        The RT token `_d_p_` with value v = d * 10^p gets v / (2i + 1) at column 2i and
        -v / (2i + 1) at column 2i + 1, each log-scaled (`number_scaling.scale_values`);
        every other row is 0 (`rows`, default `vocab_size`, may pad the table).

        >>> v = vocabulary()
        >>> [round(float(x), 4) for x in v.float_encodings(4)[v.rt_id(5, 1)]]  # 50, -50, 50/3, -50/3
        [1.8018, -1.8018, 1.316, -1.316]
        """
        from ntl_jax.data.number_scaling import scale_values

        rows = self.vocab_size if rows is None else int(rows)
        if int(emb_dim) < 2 or int(emb_dim) % 2:
            raise ValueError(f"expected an even emb_dim >= 2 (the encodings come in +/- pairs), got {emb_dim}")
        if rows < self.vocab_size:
            raise ValueError(f"expected rows >= vocab_size {self.vocab_size}, got {rows}")
        k = np.arange(len(self.pieces))
        values = (k % 10) * np.power(10.0, self.max_place - k // 10)
        divisors = np.repeat(np.arange(1, int(emb_dim), 2, dtype=np.float64), 2)
        signs = np.tile([1.0, -1.0], int(emb_dim) // 2)
        table = np.zeros((rows, int(emb_dim)), np.float32)
        table[self.base_size:self.vocab_size] = scale_values(values[:, None] * signs / divisors)
        return table

    # ---- NTL --------------------------------------------------------------------------
    def number_tokens(self):
        """The `NumberTokens` of the RT pieces, each valued at its digit (cached)."""
        if self._number_tokens is None:
            from ntl_jax._core.number_tokens import NumberTokens

            size, n = self.vocab_size, len(self.pieces)
            ids = np.arange(self.base_size, size, dtype=np.int32)
            number_values = (np.arange(n) % 10).astype(np.float32)
            values = np.full((size,), np.nan, np.float32)
            values[ids] = number_values
            self._number_tokens = NumberTokens(values, ids, number_values, np.zeros((size,), np.int32),
                                               np.zeros((size,), bool), dot_id=None)
        return self._number_tokens


@functools.lru_cache(maxsize=1)
def vocabulary() -> RtVocabulary:
    """The RT vocabulary of the trainer: the shipped one with the shipped RT pieces."""
    return RtVocabulary()
