"""`NumberTokens` from the tokenizer a MaxText config names."""

from __future__ import annotations

import functools

from ntl_jax._core.number_tokens import NumberTokens


def _wrapped(tokenizer):
    """What MaxText's tokenizer classes wrap: a `tiktoken.Encoding` (`model`), a
    SentencePiece processor (`_tokenizer_model`), a transformers tokenizer (`tokenizer`)."""
    for name in ("model", "_tokenizer_model", "tokenizer"):
        inner = getattr(tokenizer, name, None)
        if inner is not None:
            return inner
    raise TypeError(f"expected one of MaxText's tokenizers (TikToken, SentencePiece, HF), "
                    f"got {type(tokenizer).__name__}")


@functools.lru_cache(maxsize=8)
def _number_tokens(path: str, kind: str, token: str | None, digit_level: bool, prefixed_numbers: bool):
    from maxtext.input_pipeline.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(path, kind, False, False, token)
    return NumberTokens.from_tokenizer(_wrapped(tokenizer), digit_level=digit_level,
                                       prefixed_numbers=prefixed_numbers)


def number_tokens(config, *, digit_level: bool = True, prefixed_numbers: bool = False) -> NumberTokens:
    """The number tokens of the tokenizer `config.tokenizer_path` names (its
    `tokenizer_type`: "huggingface", "sentencepiece" or "tiktoken"), built by MaxText's
    own `build_tokenizer`; `digit_level`, `prefixed_numbers` as in
    `NumberTokens.from_tokenizer`.

    Raises:
      ValueError: the config names no tokenizer, or one with more ids than the model's
        `vocab_size`.
    """
    path = getattr(config, "tokenizer_path", "")
    if not path:
        raise ValueError("expected tokenizer_path in the MaxText config: NTL reads which tokens are numbers from "
                         "the tokenizer (synthetic data too), got tokenizer_path=''")
    numbers = _number_tokens(path, config.tokenizer_type, getattr(config, "hf_access_token", None) or None,
                             digit_level, prefixed_numbers)
    if numbers.vocab_size > config.vocab_size:
        raise ValueError(f"expected a tokenizer with at most vocab_size={config.vocab_size} ids, got "
                         f"{numbers.vocab_size} from {path}")
    return numbers
