"""`NumberTokens` from the Hugging Face tokenizer an EasyDeL model is trained with."""

from __future__ import annotations

from typing import Any

import ntl_jax


def number_tokens(tokenizer: Any, *, vocab_size: int | None = None, digit_level: bool = True,
                  prefixed_numbers: bool = False) -> ntl_jax.NumberTokens:
    """The number tokens of `tokenizer` (a `transformers` tokenizer, or a processor
    holding one as `.tokenizer`), digit-level by default: the single characters `0`-`9`.

    Args:
      tokenizer: the model's tokenizer (EasyDeL's `processing_class`).
      vocab_size: the model's vocabulary (its head's columns): the tokenizer must fit in it.
      digit_level, prefixed_numbers: as in `NumberTokens.from_tokenizer`.

    Raises:
      ValueError: the tokenizer has no number token, or more ids than `vocab_size`.
    """
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and not hasattr(tokenizer, "convert_ids_to_tokens"):
        tokenizer = inner  # a processor (a vision model's) around the tokenizer
    try:
        numbers = ntl_jax.NumberTokens.from_tokenizer(tokenizer, digit_level=digit_level,
                                                      prefixed_numbers=prefixed_numbers)
    except ValueError as error:
        kind = "digit tokens 0-9" if digit_level else "number tokens"
        raise ValueError(f"expected a tokenizer with {kind} for the number loss, got {type(tokenizer).__name__}: "
                         f"{error}") from error
    if vocab_size is not None and numbers.vocab_size > vocab_size:
        raise ValueError(f"expected a tokenizer with at most the model's vocab_size={vocab_size} ids, got "
                         f"{numbers.vocab_size}")
    return numbers
