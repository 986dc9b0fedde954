"""`NumberTokens` from the tokenizer a Tunix model ships with."""

from __future__ import annotations

from typing import Any

from ntl_jax._core.number_tokens import NumberTokens


def number_tokens(tokenizer: Any, **kwargs) -> NumberTokens:
    """The number tokens of `tokenizer`: Tunix's `TokenizerAdapter` (or its `Tokenizer`),
    the Hugging Face or SentencePiece tokenizer it wraps, or anything
    `NumberTokens.from_tokenizer` takes. `**kwargs` (`digit_level`,
    `prefixed_numbers`) as there.
    """
    # The adapter forwards attribute lookups to what it wraps but not len(): unwrap it.
    from tunix.generate.tokenizer_adapter import TokenizerAdapter

    if isinstance(tokenizer, TokenizerAdapter):
        tokenizer = tokenizer.tokenizer
    return NumberTokens.from_tokenizer(tokenizer, **kwargs)
