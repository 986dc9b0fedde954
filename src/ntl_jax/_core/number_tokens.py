"""Number-token tables built from a vocabulary or a tokenizer.

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

from ntl_jax._core.compat import is_traced
from ntl_jax._core.loss_params import check_number

_DIGITS = frozenset("0123456789")
# GPT-2 byte-level BPE's space, SentencePiece's space, and a plain space: `prefixed_numbers`.
_SPACE_PREFIXES = frozenset("Ġ▁ ")


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


def _is_number_piece(piece: str, *, digit_level: bool, prefixed_numbers: bool) -> bool:
    """Whether `from_pieces` with these options makes `piece` a number token."""
    marked = prefixed_numbers and piece[:1] in _SPACE_PREFIXES
    if marked and _parse_number(piece[1:], digit_level=digit_level) is not None:
        return True
    return _parse_number(piece, digit_level=digit_level) is not None


_OPTION_NOTES = {
    "digit_level=False": "digit_level=False counts every piece that parses as a finite number ('12', '-1', "
                         "'3.5'), not only the single digits 0-9",
    "prefixed_numbers=True": "prefixed_numbers=True also counts a number after one space marker ('Ġ12', '▁12'), "
                             "valued by its digits (an option of from_pieces and from_tokenizer, which also "
                             "takes what from_vocabulary takes)",
}


def _other_options_hint(pieces: Sequence[str], digit_level: bool, prefixed_numbers: bool) -> str:
    """For the no-number-token error: which other options of `from_pieces` would find
    number tokens among `pieces` (multi-digit pieces need `digit_level=False`,
    space-marked ones `prefixed_numbers=True`), how many and a few of them; "" if none."""
    current = (digit_level, prefixed_numbers)
    found = {}
    for other in dict.fromkeys(((False, prefixed_numbers), (digit_level, True), (False, True))):
        if other != current:
            found[other] = [p for p in pieces if _is_number_piece(p, digit_level=other[0], prefixed_numbers=other[1])]
    hints, options = [], []
    for other, numbers in found.items():
        both = other[0] != digit_level and other[1] != prefixed_numbers
        # Both changes: worth naming only if they find more than one change alone (a superset).
        if not numbers or both and any(len(numbers) == len(n) for o, n in found.items() if o != other and n):
            continue
        changed = [option for option, differs in (("digit_level=False", other[0] != digit_level),
                                                  ("prefixed_numbers=True", other[1] != prefixed_numbers)) if differs]
        examples = ", ".join(repr(piece) for piece in numbers[:3]) + (", ..." if len(numbers) > 3 else "")
        hints.append(f"{' with '.join(changed)} would find {len(numbers)} ({examples})")
        options += [option for option in changed if option not in options]
    if not hints:
        return ""
    return "; " + "; ".join(hints) + ". " + "; ".join(_OPTION_NOTES[option] for option in options)


@jax.tree_util.register_pytree_node_class
class NumberTokens:
    """The number tokens of a vocabulary and their values.

    Build it with `from_pieces`, `from_tokenizer` or `from_vocabulary`.

    Attributes:
      values: `[V]` float32, the value of each token id, NaN for non-number tokens.
      ids: `[N]` int32, the ids of the number tokens in increasing order.
      number_values: `[N]` float32, their values.
      digit_counts: `[V]` int32, how many digits each token writes when it is a plain
        run of digits (`7` 1, `07` 2, `123` 3), else 0 (non-numbers, and number tokens
        with a sign, point or exponent, such as `-1` or `3.5`). The number-level loss
        places a token's value by the digit counts of the tokens after it.
      opens_number: `[V]` bool, True for number tokens that begin a new number whatever
        precedes them: the space-marked pieces (`Ġ12`, `▁12`) read with
        `prefixed_numbers=True`, so the number-level loss reads "3", "Ġ12" as 3 and 12.
      dot_id: id of the `.` token, or None (used by the float-level number loss).
      vocab_size: `V`.

    Examples:
      >>> nt = NumberTokens.from_pieces(["<pad>", "</s>", "1", "0", "a", "."])
      >>> nt.ids.tolist(), nt.number_values.tolist(), nt.dot_id
      ([2, 3], [1.0, 0.0], 5)
    """

    def __init__(self, values: Any, ids: Any, number_values: Any, digit_counts: Any, opens_number: Any, *,
                 dot_id: int | None):
        self.values = values
        self.ids = ids
        self.number_values = number_values
        self.digit_counts = digit_counts
        self.opens_number = opens_number
        self.dot_id = dot_id

    # How the number statistics over this table are computed (`number_stats`): "auto",
    # each backend its own, unless a test or benchmark forces one
    # (`number_stats.with_formulation`). Static, in the pytree's structure: jit's cache
    # tells tables of different formulations apart.
    _formulation = "auto"

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_pieces(
        cls, pieces: Sequence[str], *, digit_level: bool = True, prefixed_numbers: bool = False
    ) -> "NumberTokens":
        """Builds the table from `pieces[i]`, the string of token id `i`.

        Args:
          pieces: the string of every token id, in id order.
          digit_level: if True (ntloss's and the paper's default) only the single
            characters `0`-`9` are number tokens; otherwise every piece that parses as a
            finite float (`12`, `-1`, `3.5`, `07`) is one.
          prefixed_numbers: if True, a piece that is a number after one leading space
            marker (`Ġ12`, `▁12`, ` 12`) is a number token too, with the digits after
            the marker. False (ntloss's rule) parses the piece as it is; see
            `from_tokenizer` for why that is the default.

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
        opens_number = np.zeros((len(pieces),), dtype=bool)
        dot_id = None
        for i, piece in enumerate(pieces):
            if not isinstance(piece, str):
                raise TypeError(f"expected pieces to be strings, got {type(piece).__name__} at id {i}")
            # With prefixed_numbers the digits after a space marker are the number (" 5" writes 1 digit).
            stripped = prefixed_numbers and piece[:1] in _SPACE_PREFIXES
            number = piece[1:] if stripped else piece
            value = _parse_number(number, digit_level=digit_level)
            if value is None and stripped:
                stripped, number = False, piece
                value = _parse_number(number, digit_level=digit_level)
            if value is not None:
                values[i] = value
                digit_counts[i] = len(number) if _DIGITS.issuperset(number) else 0
                opens_number[i] = stripped
            elif piece == "." and dot_id is None:
                dot_id = i
        is_number = ~np.isnan(values)
        if not is_number.any():
            kind = "a single digit 0-9" if digit_level else "a finite number"
            raise ValueError(
                f"expected at least one number token in the vocabulary (a piece that is {kind}), "
                f"got none among {len(pieces)} pieces" + _other_options_hint(pieces, digit_level, prefixed_numbers)
            )
        if is_number.all():
            raise ValueError(
                f"expected at least one non-number token in the vocabulary, got {len(pieces)} "
                "pieces that are all numbers"
            )
        ids = np.flatnonzero(is_number).astype(np.int32)
        return cls(values, ids, values[ids], digit_counts, opens_number, dot_id=dot_id)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, digit_level: bool = True, prefixed_numbers: bool = False
    ) -> "NumberTokens":
        """Builds the table from a tokenizer's token strings, one per id (docs/guides/losses.md#tokenizers).

        Args:
          tokenizer: a `tokenizers.Tokenizer`, a `transformers` tokenizer (every id below `len(tokenizer)`,
            added tokens included), a `sentencepiece.SentencePieceProcessor`, or what `from_vocabulary` takes.
          digit_level: only the single characters `0`-`9` are numbers (`▁7` too with `prefixed_numbers`);
            False: every piece that parses as one (`07` is 7, writing 2 digits in `digit_counts`).
          prefixed_numbers: also count space-prefixed pieces (`Ġ12`, `▁12`; not numbers by default, as in
            ntloss), with the value and digit count of the digits after the prefix.

        Raises:
          TypeError: if `tokenizer` offers none of these APIs, or yields non-string tokens.
          ValueError: if no token, or every token, is a number.

        Examples:
          >>> class Processor:  # the SentencePieceProcessor API
          ...     def get_piece_size(self): return 4
          ...     def id_to_piece(self, i): return ["<unk>", "▁12", "07", "7"][i]
          >>> NumberTokens.from_tokenizer(Processor(), digit_level=False).ids.tolist()
          [2, 3]
          >>> nt = NumberTokens.from_tokenizer(Processor(), digit_level=False, prefixed_numbers=True)
          >>> nt.number_values.tolist(), nt.digit_counts.tolist()
          ([12.0, 7.0, 7.0], [0, 2, 2, 1])
        """
        from ntl_jax._core.tokenizer_pieces import tokenizer_pieces

        return cls.from_pieces(tokenizer_pieces(tokenizer), digit_level=digit_level, prefixed_numbers=prefixed_numbers)

    @classmethod
    def from_vocabulary(cls, vocabulary: Any, *, digit_level: bool = True) -> "NumberTokens":
        """Builds the table from a vocabulary object (duck-typed).

        The pieces come from `vocabulary.id_to_piece(i)` when it exists, else from a
        SentencePiece `vocabulary.tokenizer.id_to_piece(i)` (seqio's
        `SentencePieceVocabulary`; its extra ids are not numbers), else from
        `vocabulary.decode([i])` (e.g. `seqio.ByteVocabulary`), for every id below
        `vocabulary.vocab_size`. For a Hugging Face or SentencePiece tokenizer use
        `from_tokenizer` (`vocab_size` leaves out a `transformers` tokenizer's added tokens,
        and `decode` turns `Ġ12` into ` 12`).

        A vocabulary whose number tokens are not plain numbers (the Regression
        Transformer's `_d_p_`, `ntl_jax.seqio.rt_vocabulary()`) gives its own table
        through a `number_tokens()` method, which is returned as it is.
        """
        from ntl_jax._core.tokenizer_pieces import vocabulary_pieces

        own = getattr(vocabulary, "number_tokens", None)
        if callable(own):
            table = own()
            if not isinstance(table, cls):
                raise TypeError(f"expected {type(vocabulary).__name__}.number_tokens() to return NumberTokens, "
                                f"got {type(table).__name__}")
            return table

        return cls.from_pieces(vocabulary_pieces(vocabulary), digit_level=digit_level)

    # -- pytree -------------------------------------------------------------------

    def tree_flatten(self):
        children = (self.values, self.ids, self.number_values, self.digit_counts, self.opens_number)
        return children, (self.dot_id, self._formulation)

    @classmethod
    def tree_unflatten(cls, aux, children):
        dot_id, formulation = aux
        table = cls(*children, dot_id=dot_id)
        table._formulation = formulation
        return table

    # -- derived tables -----------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_numbers(self) -> int:
        return int(self.ids.shape[0])

    def at_numbers(self, table: Any, dtype) -> jax.Array:
        """The `[N]` entries of a `[V]` per-token table (`digit_counts`, `opens_number`)
        at the number tokens, in `dtype`: taken on the host for a concrete table (a
        constant of the program; on the TPU a gathered element costs a memory tile)."""
        if is_traced(table) or is_traced(self.ids):
            return jnp.asarray(table, dtype)[jnp.asarray(self.ids)]
        return jnp.asarray(np.asarray(table)[np.asarray(self.ids)], dtype)

    def distance_table(self, squash_factor: float | None = None) -> jax.Array:
        """`[N, N]` float32 costs of predicting number token j for target token i: `|v_i -
        v_j|` (ntloss's `dist_lookup`), or with `squash_factor` (> 1) its squashed form, as
        `ntl_jax.losses.was(squash_factor=...)` charges them.

        Raises:
          TypeError: for a `squash_factor` that is not a Python number.
          ValueError: for a `squash_factor` not finite and > 1, or a table without three
            distinct values to squash.
        """
        if squash_factor is not None:
            check_number("was", "squash_factor", squash_factor, low=1.0, low_inclusive=False)
            check_squashable(self)
        v = jnp.asarray(self.number_values, jnp.float32)
        return squash_distances(self, jnp.abs(v[:, None] - v[None, :]), squash_factor)

    def __repr__(self) -> str:
        return (
            f"NumberTokens(vocab_size={self.vocab_size}, num_numbers={self.num_numbers}, "
            f"dot_id={self.dot_id}"
            + (")" if self._formulation == "auto" else f", formulation={self._formulation!r})")
        )


# -- Distances between the number tokens' values (NTL-WAS's costs) -----------------------


def squash_distances(number_tokens: NumberTokens, distances, squash_factor: float | None):
    """Maps |v_i - v_j| distances (any shape) to their squashed costs: off-diagonal
    distances linearly, so the table's closest wrong token costs 1 and its farthest
    `squash_factor`; a zero distance stays 0. None leaves them as they are."""
    if squash_factor is None:
        return distances
    v = jnp.asarray(number_tokens.number_values, jnp.float32)
    table = jnp.abs(v[:, None] - v[None, :])
    closest = jnp.min(jnp.where(table == 0, jnp.finfo(jnp.float32).max, table))
    spread = jnp.max(table) - closest
    # A traced table with fewer than three distinct values: every wrong token costs 1.
    scale = jnp.where(spread > 0, (squash_factor - 1.0) / jnp.where(spread > 0, spread, 1.0), 0.0)
    return jnp.where(distances == 0, 0.0, 1.0 + (distances - closest) * scale)


def check_squashable(number_tokens: NumberTokens) -> None:
    """Raises ValueError unless a concrete table has three distinct values: squashing maps
    the closest wrong distance to 1 and the farthest to `squash_factor`."""
    if is_traced(number_tokens.number_values):
        return
    values = np.asarray(number_tokens.number_values, np.float64)
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) >= 3:
        return
    duplicated = [float(d) for d, c in zip(distinct, counts) if c > 1]
    dup = f"; value(s) {duplicated} appear on more than one token" if duplicated else ""
    raise ValueError(
        "number loss 'was': expected number tokens with at least 3 distinct values for squash_factor (the "
        f"closest and farthest wrong tokens must differ), got values {[float(x) for x in values]}{dup}")
