"""Number-token tables the benchmarks run on (`--vocab t5|llama3`).

- `t5`: T5's 32,128-piece SentencePiece vocabulary as far as NTL sees it: the ten digits
  0-9 once (digit level), the rest non-numbers. Each script keeps its own layout of it.
- `llama3`: a LLaMA-3-like vocabulary of 128,256 pieces. LLaMA-3's pre-tokenizer splits
  digits into runs of one to three (`\\p{N}{1,3}`), so its BPE vocabulary holds every
  number 0-999 as a piece, plus the leading-zero pieces "00"-"09" and "000"-"099" (values
  0-99 again): 1,110 number tokens (`digit_level=False`). As in LLaMA-3, "." is id 13,
  "0"-"9" are ids 15-24 and the last 256 ids are special tokens; the other 1,100 number
  pieces sit at scattered ids (seeded), as merges put them in a real BPE vocabulary.
"""

from __future__ import annotations

import numpy as np

VOCABS = ("t5", "llama3")
LLAMA3_VOCAB = 128_256
# Every piece LLaMA-3's `\p{N}{1,3}` split can produce from ASCII digits.
LLAMA3_NUMBER_PIECES = ([str(n) for n in range(1000)] + [f"{n:02d}" for n in range(10)]
                        + [f"{n:03d}" for n in range(100)])
_LLAMA3_SPECIALS = 256
_LLAMA3_DOT, _LLAMA3_ZERO = 13, 15  # ids of "." and "0" in LLaMA-3's tokenizer
_FIRST_SCATTERED = 256  # after the byte-level single characters
MIN_LLAMA3_VOCAB = 4096


def llama3_pieces(vocab: int = LLAMA3_VOCAB, seed: int = 0) -> list[str]:
    """`vocab` pieces laid out as described in the module docstring (the tail of special
    tokens and the scattered number ids scale with `vocab`, so small shapes work too)."""
    if vocab < MIN_LLAMA3_VOCAB:
        raise ValueError(f"expected a vocabulary of at least {MIN_LLAMA3_VOCAB} pieces for the LLaMA-3-like table "
                         f"({len(LLAMA3_NUMBER_PIECES)} number tokens among them), got {vocab}")
    pieces = [f"w{i}" for i in range(vocab)]  # "w..." never parses as a number
    for i in range(vocab - _LLAMA3_SPECIALS, vocab):
        pieces[i] = f"<|reserved_special_token_{i - (vocab - _LLAMA3_SPECIALS)}|>"
    pieces[_LLAMA3_DOT] = "."
    for d in range(10):
        pieces[_LLAMA3_ZERO + d] = str(d)
    rest = LLAMA3_NUMBER_PIECES[10:]
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(_FIRST_SCATTERED, vocab - _LLAMA3_SPECIALS), size=len(rest), replace=False)
    for i, piece in zip(ids, rest):
        pieces[int(i)] = piece
    return pieces


def llama3_number_tokens(vocab: int = LLAMA3_VOCAB):
    """The `NumberTokens` of `llama3_pieces(vocab)`: every number piece, not only digits."""
    from ntl_jax import NumberTokens

    return NumberTokens.from_pieces(llama3_pieces(vocab), digit_level=False)


def sample_targets(rng, shape, number_ids, other_ids, number_share):
    """`[batch, length]` int64 targets: about `number_share` drawn from `number_ids`, the
    rest from `other_ids` (both 1-d arrays of token ids). The draws are those the
    benchmarks made before this module existed, so their T5 inputs are unchanged."""
    batch, length = shape
    number_ids, other_ids = np.asarray(number_ids), np.asarray(other_ids)
    numbers = number_ids[rng.integers(0, len(number_ids), size=(batch, length))]
    others = other_ids[rng.integers(0, len(other_ids), size=(batch, length))]
    is_number = rng.uniform(size=(batch, length)) < number_share
    return np.where(is_number, numbers, others).astype(np.int64)
