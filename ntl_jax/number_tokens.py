"""Number-token tables built from a vocabulary.

A `NumberTokens` holds, for a vocabulary of size `V`, the numeric value of every token
(NaN for tokens that are not numbers), the ids and values of the `N` number tokens, how
many digits each number token writes, and the id of the decimal point. It is a JAX
pytree, so it can be a closure constant or an argument of a jitted function; everything
derived from it (the distance table, the largest distance) is computed with `jnp` and
therefore works on traced values too.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_DIGITS = frozenset("0123456789")


def _parse_number(piece: str, *, digit_level: bool) -> float | None:
    """The value of `piece` if it is a number token, else None.

    Follows ntloss 0.3.2: digit level keeps only the single ASCII characters 0-9;
    otherwise anything Python's `float` parses to a finite value counts.
    """
    if digit_level:
        return float(piece) if piece in _DIGITS else None
    try:
        value = float(piece)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@jax.tree_util.register_pytree_node_class
class NumberTokens:
    """The number tokens of a vocabulary and their values.

    Build it with `from_pieces` or `from_vocabulary`.

    Attributes:
      values: `[V]` float32, the value of each token id, NaN for non-number tokens.
      ids: `[N]` int32, the ids of the number tokens in increasing order.
      number_values: `[N]` float32, their values.
      digit_counts: `[V]` int32, how many digits each token writes when it is a plain
        run of digits (`7` 1, `07` 2, `123` 3), else 0 (non-numbers, and number tokens
        with a sign, point or exponent, such as `-1` or `3.5`). The number-level loss
        places a token's value by the digit counts of the tokens after it.
      dot_id: id of the `.` token, or None (used by the float-level number loss).
      vocab_size: `V`.

    >>> nt = NumberTokens.from_pieces(["<pad>", "</s>", "1", "0", "a", "."])
    >>> nt.ids.tolist(), nt.number_values.tolist(), nt.dot_id
    ([2, 3], [1.0, 0.0], 5)
    """

    def __init__(self, values: Any, ids: Any, number_values: Any, digit_counts: Any, *, dot_id: int | None):
        self.values = values
        self.ids = ids
        self.number_values = number_values
        self.digit_counts = digit_counts
        self.dot_id = dot_id

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], *, digit_level: bool = True) -> "NumberTokens":
        """Builds the table from `pieces[i]`, the string of token id `i`.

        Args:
          pieces: the string of every token id, in id order.
          digit_level: if True (ntloss's and the paper's default) only the single
            characters `0`-`9` are number tokens; otherwise every piece that parses as a
            finite float (`12`, `-1`, `3.5`, `07`) is one.

        Raises:
          TypeError: if `pieces` is a single string (rather than one string per id) or
            holds something other than strings.
          ValueError: if no token, or every token, is a number.
        """
        if isinstance(pieces, (str, bytes)):
            raise TypeError(
                "expected pieces to be a sequence of strings, one per token id, got a single "
                f"{type(pieces).__name__} {pieces[:40]!r}; pass list_of_pieces, not one string"
            )
        pieces = list(pieces)
        values = np.full((len(pieces),), np.nan, dtype=np.float32)
        digit_counts = np.zeros((len(pieces),), dtype=np.int32)
        dot_id = None
        for i, piece in enumerate(pieces):
            if not isinstance(piece, str):
                raise TypeError(f"expected pieces to be strings, got {type(piece).__name__} at id {i}")
            value = _parse_number(piece, digit_level=digit_level)
            if value is not None:
                values[i] = value
                digit_counts[i] = len(piece) if _DIGITS.issuperset(piece) else 0
            elif piece == "." and dot_id is None:
                dot_id = i
        is_number = ~np.isnan(values)
        if not is_number.any():
            kind = "a single digit 0-9" if digit_level else "a finite number"
            raise ValueError(
                f"expected at least one number token in the vocabulary (a piece that is {kind}), "
                f"got none among {len(pieces)} pieces"
            )
        if is_number.all():
            raise ValueError(
                f"expected at least one non-number token in the vocabulary, got {len(pieces)} "
                "pieces that are all numbers"
            )
        ids = np.flatnonzero(is_number).astype(np.int32)
        return cls(values, ids, values[ids], digit_counts, dot_id=dot_id)

    @classmethod
    def from_vocabulary(cls, vocabulary: Any, *, digit_level: bool = True) -> "NumberTokens":
        """Builds the table from a vocabulary object (duck-typed).

        The pieces come from `vocabulary.id_to_piece(i)` when it exists, else from a
        SentencePiece `vocabulary.tokenizer.id_to_piece(i)` (seqio's
        `SentencePieceVocabulary`; its extra ids are not numbers), else from
        `vocabulary.decode([i])` (e.g. `seqio.ByteVocabulary`), for every id below
        `vocabulary.vocab_size`.
        """
        size = int(vocabulary.vocab_size)
        if hasattr(vocabulary, "id_to_piece"):
            pieces = [vocabulary.id_to_piece(i) for i in range(size)]
        elif hasattr(getattr(vocabulary, "tokenizer", None), "id_to_piece"):
            processor = vocabulary.tokenizer
            known = processor.get_piece_size()
            pieces = [processor.id_to_piece(i) if i < known else f"<extra_id_{i}>" for i in range(size)]
        elif hasattr(vocabulary, "decode"):
            pieces = [vocabulary.decode([i]) for i in range(size)]
        else:
            raise TypeError(
                "expected a vocabulary with `id_to_piece`, `tokenizer.id_to_piece` or `decode`, "
                f"got {type(vocabulary).__name__}"
            )
        return cls.from_pieces(pieces, digit_level=digit_level)

    # -- pytree -------------------------------------------------------------------

    def tree_flatten(self):
        return (self.values, self.ids, self.number_values, self.digit_counts), self.dot_id

    @classmethod
    def tree_unflatten(cls, dot_id, children):
        return cls(*children, dot_id=dot_id)

    # -- derived tables -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_numbers(self) -> int:
        return int(self.ids.shape[0])

    def distance_table(self, squash_factor: float | None = None) -> jax.Array:
        """`[N, N]` float32 table of |v_i - v_j| (ntloss's `dist_lookup`).

        With `squash_factor` s > 1 the off-diagonal distances are mapped linearly so the
        closest wrong token costs 1 and the farthest costs s; the diagonal stays 0.
        """
        v = jnp.asarray(self.number_values, jnp.float32)
        return self.squash(jnp.abs(v[:, None] - v[None, :]), squash_factor)

    def squash(self, distances: jax.Array, squash_factor: float | None) -> jax.Array:
        """Maps |v_i - v_j| distances (any shape) to their squashed costs.

        Off-diagonal distances are mapped linearly so the closest wrong token of the
        table costs 1 and the farthest costs `squash_factor`; a zero distance stays 0.
        None leaves the distances as they are.
        """
        if squash_factor is None:
            return distances
        check_squash_factor(squash_factor)
        self.check_squashable()
        v = jnp.asarray(self.number_values, jnp.float32)
        table = jnp.abs(v[:, None] - v[None, :])
        closest = jnp.min(jnp.where(table == 0, jnp.finfo(jnp.float32).max, table))
        spread = jnp.max(table) - closest
        # Traced tables cannot be checked: with fewer than three distinct values every
        # wrong token costs 1 instead of NaN.
        scale = jnp.where(spread > 0, (squash_factor - 1.0) / jnp.where(spread > 0, spread, 1.0), 0.0)
        return jnp.where(distances == 0, 0.0, 1.0 + (distances - closest) * scale)

    def check_squashable(self) -> None:
        """Raises ValueError if the number values cannot be squashed.

        Squashing maps the closest wrong distance to 1 and the farthest to
        `squash_factor`; it needs at least three distinct values (two different
        nonzero distances). Only concrete tables are checked.
        """
        if isinstance(self.number_values, jax.core.Tracer):
            return
        values = np.asarray(self.number_values, np.float64)
        distinct, counts = np.unique(values, return_counts=True)
        if len(distinct) >= 3:
            return
        duplicated = [float(d) for d, c in zip(distinct, counts) if c > 1]
        dup = f"; value(s) {duplicated} appear on more than one token" if duplicated else ""
        raise ValueError(
            "expected number tokens with at least 3 distinct values for squash_factor (the closest "
            f"and farthest wrong tokens must differ), got values {[float(x) for x in values]}{dup}"
        )

    def __repr__(self) -> str:
        return (
            f"NumberTokens(vocab_size={self.vocab_size}, num_numbers={self.num_numbers}, "
            f"dot_id={self.dot_id})"
        )


def check_squash_factor(squash_factor: Any) -> None:
    """Raises unless `squash_factor` is None or a finite number greater than 1."""
    if squash_factor is None:
        return
    is_real = isinstance(squash_factor, (int, float, np.integer, np.floating))
    if isinstance(squash_factor, (bool, np.bool_)) or not is_real:
        raise TypeError(f"expected squash_factor to be None or a number > 1, got {squash_factor!r}")
    if not math.isfinite(squash_factor):
        raise ValueError(f"expected squash_factor finite and > 1, got {squash_factor}")
    if not squash_factor > 1:
        raise ValueError(f"expected squash_factor > 1 (1 would recover cross-entropy), got {squash_factor}")
