"""`NumberTokens` from a KerasHub tokenizer, and back and forth from a Keras config.

KerasHub's SentencePiece tokenizers (Gemma) list their pieces in id order
(`get_vocabulary()`); its byte-pair tokenizers (Llama 3, Qwen) hold a `vocabulary`
dictionary from piece to id, written in GPT-2's byte alphabet as the Hugging Face
versions are (`Ġ` a space). Either way the pieces go to `NumberTokens.from_pieces`, the
one table builder every integration uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ntl_jax._core.number_tokens import NumberTokens

_DIGITS = frozenset("0123456789")


def keras_hub_pieces(tokenizer: Any) -> list[str]:
    """The piece of every id of a KerasHub tokenizer, in id order (`""` for an id with no
    piece)."""
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if isinstance(vocabulary, dict):  # BytePairTokenizer: piece -> id
        return _pieces_in_id_order(vocabulary)
    get_vocabulary = getattr(tokenizer, "get_vocabulary", None)
    if not callable(get_vocabulary):
        raise TypeError(
            "expected a KerasHub tokenizer (keras_hub.tokenizers.Tokenizer: GemmaTokenizer, Llama3Tokenizer, "
            f"QwenTokenizer, ...) with get_vocabulary(), got {type(tokenizer).__name__}"
        )
    try:
        pieces = get_vocabulary()
    except ValueError as error:  # KerasHub: "No vocabulary has been set ..."
        raise ValueError(f"expected a tokenizer with its vocabulary loaded: {error}") from None
    if isinstance(pieces, dict):
        return _pieces_in_id_order(pieces)
    return [str(piece) for piece in pieces]


def _pieces_in_id_order(vocabulary: dict) -> list[str]:
    pieces = [""] * (max(map(int, vocabulary.values()), default=-1) + 1)
    for piece, i in vocabulary.items():
        pieces[int(i)] = piece
    return pieces


def number_tokens(tokenizer: Any, *, digit_level: bool | None = None, prefixed_numbers: bool = False) -> NumberTokens:
    """The number tokens of a KerasHub tokenizer (or a `NumberTokens`, returned as it is).

    Args:
      tokenizer: a `keras_hub` tokenizer (`causal_lm.preprocessor.tokenizer`): Gemma's
        SentencePiece, Llama 3's or Qwen's byte-pair, or any with `get_vocabulary()`.
      digit_level: True: only the single digits `0`-`9` are number tokens (the paper's
        default); False: every piece that reads as a finite number (`"123"`, `"07"`).
        None (the default): False when the vocabulary has pieces of several digits
        (Llama 3's `"0"`-`"999"`: KerasHub's byte-pair tokenizers cut numbers into
        groups of up to three digits and merge what the vocabulary can), else True
        (Gemma's SentencePiece vocabulary splits every digit).
      prefixed_numbers: also count a number after one space marker (`▁12`, `Ġ12`), as
        `NumberTokens.from_pieces`.

    Raises:
      ValueError: the vocabulary has no number token (the message names the options
        that would find some), or every piece is one.
    """
    if isinstance(tokenizer, NumberTokens):
        return tokenizer
    pieces = keras_hub_pieces(tokenizer)
    if digit_level is None:
        digit_level = not any(len(piece) > 1 and _DIGITS.issuperset(piece) for piece in pieces)
    try:
        return NumberTokens.from_pieces(pieces, digit_level=digit_level, prefixed_numbers=prefixed_numbers)
    except ValueError as error:
        raise ValueError(f"{type(tokenizer).__name__} has no number tokens to weigh: {error}") from None


def number_tokens_config(table: NumberTokens) -> dict:
    """A JSON-able description of `table`: the vocabulary size and, for each number token
    only, its id, value, digit count and whether it opens a number (so a 256K vocabulary
    stores ten entries)."""
    ids = np.asarray(table.ids)
    return {
        "vocab_size": table.vocab_size,
        "ids": ids.tolist(),
        "values": np.asarray(table.number_values, np.float64).tolist(),
        "digit_counts": np.asarray(table.digit_counts)[ids].tolist(),
        "opens_number": np.asarray(table.opens_number)[ids].tolist(),
        "dot_id": table.dot_id,
    }


def number_tokens_from_config(config: dict) -> NumberTokens:
    """The `NumberTokens` that `number_tokens_config` described."""
    size, ids = int(config["vocab_size"]), np.asarray(config["ids"], np.int32)
    values = np.full((size,), np.nan, np.float32)
    values[ids] = np.asarray(config["values"], np.float32)
    digit_counts = np.zeros((size,), np.int32)
    digit_counts[ids] = np.asarray(config["digit_counts"], np.int32)
    opens_number = np.zeros((size,), bool)
    opens_number[ids] = np.asarray(config["opens_number"], bool)
    dot_id = config.get("dot_id")
    return NumberTokens(values, ids, values[ids], digit_counts, opens_number,
                        dot_id=None if dot_id is None else int(dot_id))


def resolve_number_tokens(number_tokens_or_tokenizer: Any) -> NumberTokens:
    """A `NumberTokens`, its config (`number_tokens_config`), or a KerasHub tokenizer."""
    if isinstance(number_tokens_or_tokenizer, NumberTokens):
        return number_tokens_or_tokenizer
    if isinstance(number_tokens_or_tokenizer, dict):
        return number_tokens_from_config(number_tokens_or_tokenizer)
    return number_tokens(number_tokens_or_tokenizer)
