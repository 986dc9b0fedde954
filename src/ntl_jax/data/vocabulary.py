"""The shipped digit-level SentencePiece vocabulary, with `sentencepiece` alone.

`default_vocabulary()` reads the model in `ntl_jax/data/vocab_assets` (trained on generated
mathematics text with `split_digits=True`, digits as fixed symbols, pad 0 / eos 1 /
unk 2; regenerate with `scripts/make_vocab.py`). It needs neither seqio nor
TensorFlow, so the trainer installs without them; it encodes and decodes like
`seqio.SentencePieceVocabulary` on the same model (the SeqIO tasks' vocabulary,
`ntl_jax.seqio.vocabularies.sentencepiece_vocabulary()`).

The seqio vocabularies (`DigitSplitVocabulary`, `byte_vocabulary`) are in
`ntl_jax.seqio.vocabularies`. `ntl_jax.NumberTokens.from_vocabulary` accepts all of them and
finds exactly ten digit tokens.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab_assets")
DEFAULT_SPM_PATH = os.path.join(ASSETS_DIR, "ntl_math.model")


class SentencePieceVocabulary:
    """A SentencePiece model as a vocabulary: `encode(str) -> list[int]`,
    `decode(ids) -> str`, `id_to_piece(i)`, `vocab_size` and the special ids.

    Decoding follows seqio's `SentencePieceVocabulary.decode`: ids outside the model
    (e.g. a network's vocabulary padded to a multiple of 128) decode as the unknown
    token, everything after the first EOS is dropped, and pad / EOS decode to nothing.
    The processor is loaded lazily and left out of pickles.
    """

    def __init__(self, model_file: str = DEFAULT_SPM_PATH):
        self._model_file = os.fspath(model_file)
        self._processor = None

    @property
    def model_file(self) -> str:
        return self._model_file

    @property
    def tokenizer(self):
        """The `sentencepiece.SentencePieceProcessor` (loaded on first use)."""
        if self._processor is None:
            import sentencepiece

            self._processor = sentencepiece.SentencePieceProcessor(model_file=self._model_file)
        return self._processor

    # ---- pickling and identity --------------------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_processor"] = None
        return state

    def __eq__(self, other):
        return (isinstance(other, SentencePieceVocabulary)
                and os.path.realpath(self._model_file) == os.path.realpath(other._model_file))

    def __hash__(self):
        return hash((type(self).__name__, os.path.realpath(self._model_file)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._model_file!r})"

    # ---- sizes and special ids --------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_piece_size())

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_id())

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_id())

    @property
    def unk_id(self) -> int:
        return int(self.tokenizer.unk_id())

    @property
    def bos_id(self) -> int:
        return int(self.tokenizer.bos_id())  # -1: the shipped model has none

    # ---- pieces, encoding, decoding ---------------------------------------------------
    def id_to_piece(self, i: int) -> str:
        """The piece of token `i` (e.g. '▁What', '7', '<pad>')."""
        i = int(i)
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"expected a token id in [0, {self.vocab_size}), got {i}")
        return self.tokenizer.id_to_piece(i)

    def encode(self, s: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(s)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` up to the first EOS; unknown and out-of-range ids as ' ⁇ '."""
        ids = np.asarray(ids).reshape(-1).tolist() if isinstance(ids, np.ndarray) else list(ids)
        size, unk, eos = self.vocab_size, self.unk_id, self.eos_id
        clean = [int(i) if 0 <= int(i) < size else unk for i in ids]
        if eos in clean:
            clean = clean[: clean.index(eos) + 1]
        return self.tokenizer.decode(clean)


def default_vocabulary() -> SentencePieceVocabulary:
    """The shipped digit-split SentencePiece vocabulary (1,000 pieces)."""
    return SentencePieceVocabulary(DEFAULT_SPM_PATH)


def digit_token_ids(vocabulary: Any) -> list[int]:
    """Ids of the ten single-digit tokens '0'..'9', in digit order (a quick check that
    `vocabulary` is digit-level; `NumberTokens.from_vocabulary` is the full table)."""
    from ntl_jax._core.number_tokens import NumberTokens

    nt = NumberTokens.from_vocabulary(vocabulary)
    order = np.argsort(np.asarray(nt.number_values))
    return [int(i) for i in np.asarray(nt.ids)[order]]
