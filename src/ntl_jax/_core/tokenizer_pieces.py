"""One piece string per token id, from a tokenizer or a vocabulary object.

`NumberTokens.from_tokenizer` and `NumberTokens.from_vocabulary` read their pieces here.
Everything is duck-typed, so neither `tokenizers`, `transformers` nor `sentencepiece` is
imported. The pieces are the tokenizer's own token strings, not decoded text: byte-level
BPE tokens (GPT-2, LLaMA-3, Qwen) are written in GPT-2's byte-to-unicode alphabet
(`Ġ` is a space, `Ċ` a newline), SentencePiece writes a space as `▁`. An id the
tokenizer has no token for (a hole in its vocabulary) gets the piece `""`, which is
never a number.

Examples:
  >>> class Processor:  # the sentencepiece.SentencePieceProcessor API
  ...     def get_piece_size(self):
  ...         return 3
  ...     def id_to_piece(self, i):
  ...         return ["<unk>", "▁12", "7"][i]
  >>> tokenizer_pieces(Processor())
  ['<unk>', '▁12', '7']
"""

from __future__ import annotations

import functools
from typing import Any

_EXPECTED = (
    "a tokenizer with `convert_ids_to_tokens` and `len()` (transformers), `id_to_token` and "
    "`get_vocab_size` (tokenizers.Tokenizer), `id_to_piece` and `get_piece_size` "
    "(sentencepiece.SentencePieceProcessor), `decode_single_token_bytes` and `n_vocab` "
    "(tiktoken.Encoding), or a vocabulary with `vocab_size` and `id_to_piece`, "
    "`tokenizer.id_to_piece` or `decode`"
)


def tokenizer_pieces(tokenizer: Any) -> list[str]:
    """The token string of every id of `tokenizer`, in id order.

    Which ids: a `transformers` tokenizer's `len(tokenizer)` (its added tokens included;
    `vocab_size` counts the base vocabulary only), a `tokenizers.Tokenizer`'s
    `get_vocab_size(with_added_tokens=True)`, a SentencePiece processor's
    `get_piece_size()`, a `tiktoken.Encoding`'s `n_vocab` (each token's bytes written in
    GPT-2's byte-to-unicode alphabet, as the same tokenizer's Hugging Face version writes
    them, so `" 12"` is `Ġ12` there and here; holes as `""`); for the first two, one
    past the largest id in `get_vocab()` when that is more (a vocabulary with holes).
    Anything `vocabulary_pieces` takes (the `NumberTokens.from_vocabulary` objects) works
    too.

    Raises:
      TypeError: if `tokenizer` offers none of these APIs.
    """
    if isinstance(tokenizer, (str, bytes, list, tuple, dict)):
        hint = {
            "str": "; load a tokenizer.json with tokenizers.Tokenizer.from_file(path) first",
            "list": "; for a list of pieces use NumberTokens.from_pieces",
            "tuple": "; for a sequence of pieces use NumberTokens.from_pieces",
        }.get(type(tokenizer).__name__, "")
        raise TypeError(f"expected {_EXPECTED}, got a {type(tokenizer).__name__}{hint}")
    if callable(getattr(tokenizer, "convert_ids_to_tokens", None)) and hasattr(tokenizer, "__len__"):
        size = _size_with_holes(len(tokenizer), tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    elif callable(getattr(tokenizer, "id_to_token", None)) and callable(getattr(tokenizer, "get_vocab_size", None)):
        size = _size_with_holes(tokenizer.get_vocab_size(with_added_tokens=True), tokenizer, with_added_tokens=True)
        pieces = [tokenizer.id_to_token(i) for i in range(size)]
    elif callable(getattr(tokenizer, "id_to_piece", None)) and callable(getattr(tokenizer, "get_piece_size", None)):
        pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())]
    elif callable(getattr(tokenizer, "decode_single_token_bytes", None)) and hasattr(tokenizer, "n_vocab"):
        pieces = [_tiktoken_piece(tokenizer, i) for i in range(tokenizer.n_vocab)]
    elif _is_vocabulary(tokenizer):
        pieces = vocabulary_pieces(tokenizer)
    else:
        raise TypeError(f"expected {_EXPECTED}, got {type(tokenizer).__name__}")
    return ["" if piece is None else piece for piece in pieces]


def vocabulary_pieces(vocabulary: Any) -> list[str]:
    """The piece of every id below `vocabulary.vocab_size` (seqio-style vocabularies).

    From `vocabulary.id_to_piece(i)` when it exists, else from a SentencePiece
    `vocabulary.tokenizer.id_to_piece(i)` (seqio's `SentencePieceVocabulary`; its extra
    ids are not numbers), else from `vocabulary.decode([i])` (e.g. `seqio.ByteVocabulary`).
    """
    if not _is_vocabulary(vocabulary):
        raise TypeError(
            "expected a vocabulary with `id_to_piece`, `tokenizer.id_to_piece` or `decode`, "
            f"got {type(vocabulary).__name__}"
        )
    size = int(vocabulary.vocab_size)
    if hasattr(vocabulary, "id_to_piece"):
        return [vocabulary.id_to_piece(i) for i in range(size)]
    if hasattr(getattr(vocabulary, "tokenizer", None), "id_to_piece"):
        processor = vocabulary.tokenizer
        known = processor.get_piece_size()
        return [processor.id_to_piece(i) if i < known else f"<extra_id_{i}>" for i in range(size)]
    return [vocabulary.decode([i]) for i in range(size)]


def _tiktoken_piece(encoding: Any, i: int) -> str:
    try:
        token = encoding.decode_single_token_bytes(i)
    except KeyError:  # a hole: no token has this id
        return ""
    alphabet = _byte_alphabet()
    return "".join(alphabet[b] for b in token)


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-to-unicode map, the alphabet of byte-level BPE tokens: printable
    bytes stand for themselves, the others for the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = iter(range(256, 512))
    return tuple(chr(b) if b in printable else chr(next(others)) for b in range(256))


def _is_vocabulary(vocabulary: Any) -> bool:
    size = getattr(vocabulary, "vocab_size", None)
    if size is None or callable(size):  # SentencePieceProcessor.vocab_size is a method
        return False
    return (
        hasattr(vocabulary, "id_to_piece")
        or hasattr(getattr(vocabulary, "tokenizer", None), "id_to_piece")
        or hasattr(vocabulary, "decode")
    )


def _size_with_holes(size: int, tokenizer: Any, **get_vocab_kwargs: Any) -> int:
    """`size`, or one past the largest id of `get_vocab()` when the vocabulary has holes."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if not callable(get_vocab):
        return int(size)
    ids = get_vocab(**get_vocab_kwargs).values()
    return max(int(size), max(ids, default=-1) + 1)
