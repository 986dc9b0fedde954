"""SeqIO vocabularies in which every digit is one token (these need seqio and TensorFlow).

* `sentencepiece_vocabulary()`: the SentencePiece model shipped in `ntl_jax/data/vocab_assets`
  as a `seqio.SentencePieceVocabulary` (the `ntl_math_*` tasks' vocabulary; the trainer
  uses the same model through `ntl_jax.data.vocabulary.default_vocabulary()`, without seqio).
* `DigitSplitVocabulary(base)`: makes any seqio vocabulary digit-level the way the
  paper's T5 tokenizer did: every piece containing a digit is split into single
  characters. Use it to fine-tune public T5 checkpoints with their own vocabulary.
* `byte_vocabulary()`: `seqio.ByteVocabulary` is digit-level as it is (digits are ids 51..60).
* `rt_vocabulary()`: the Regression Transformer's (`RtSeqioVocabulary`), the shipped model
  with a token per digit and decimal place, the ids of the trainer's RT systems.

`ntl_jax.NumberTokens.from_vocabulary` accepts the first three and finds exactly ten digit
tokens; the RT vocabulary's are its `number_tokens()`.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import seqio
import tensorflow as tf

from ntl_jax.data import rt_vocabulary as rt_vocabulary_lib
from ntl_jax.data.vocabulary import DEFAULT_SPM_PATH

_HAS_DIGIT = re.compile(r"\d")
_DIGIT_OR_RUN = re.compile(r"\d|\D+")


def sentencepiece_vocabulary(extra_ids: int = 0) -> seqio.SentencePieceVocabulary:
    """The shipped digit-split SentencePiece model as a seqio vocabulary
    (1,000 pieces + `extra_ids`)."""
    return seqio.SentencePieceVocabulary(DEFAULT_SPM_PATH, extra_ids=extra_ids)


def byte_vocabulary() -> seqio.ByteVocabulary:
    """`seqio.ByteVocabulary()`: 259 ids, digits '0'..'9' are ids 51..60."""
    return seqio.ByteVocabulary()


def output_features(byte: bool = False, *, vocabulary: seqio.Vocabulary | None = None) -> dict[str, seqio.Feature]:
    """`inputs` and `targets` features, both with EOS, on the shipped SentencePiece
    vocabulary, (`byte`) on `seqio.ByteVocabulary`, or on `vocabulary`: those of every
    ntl_jax task."""
    if vocabulary is not None and byte:
        raise ValueError(f"expected byte=True or a vocabulary, got both (vocabulary={vocabulary})")
    v = vocabulary if vocabulary is not None else byte_vocabulary() if byte else sentencepiece_vocabulary()
    return {
        "inputs": seqio.Feature(vocabulary=v, add_eos=True, required=True),
        "targets": seqio.Feature(vocabulary=v, add_eos=True),
    }


class DigitSplitVocabulary(seqio.Vocabulary):
    """Wraps a seqio vocabulary so that every digit is encoded as its own token.

    Encoding runs the base vocabulary, then replaces every ordinary piece that
    contains a digit (e.g. T5's `▁17` or `-3`) by the ids of its single characters
    (`▁`, `1`, `7`), following the paper's T5 tokenizer. A character the base
    vocabulary lacks is kept in the largest known run instead, and a piece that cannot
    be split that way is left whole, so `decode(encode(s)) == decode_base(encode_base(s))`.
    Ids, special ids, `vocab_size` and decoding are the base vocabulary's, so a model
    or checkpoint built for the base vocabulary works unchanged.

    Examples:
      >>> vocab = DigitSplitVocabulary(sentencepiece_vocabulary())
      >>> [vocab.id_to_piece(i) for i in vocab.encode("-17.5")]
      ['▁-', '1', '7', '.', '5']
    """

    def __init__(self, base: seqio.Vocabulary):
        if not isinstance(base, seqio.Vocabulary):
            raise TypeError(f"expected a seqio.Vocabulary, got {type(base).__name__}")
        if isinstance(base, DigitSplitVocabulary):
            base = base.base
        self._base = base
        self._tables = None
        super().__init__(extra_ids=0)

    # ---- identity -------------------------------------------------------------------
    @property
    def base(self) -> seqio.Vocabulary:
        return self._base

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tables"] = None  # rebuilt lazily; keeps pickles (gin) small
        return state

    def __eq__(self, other):
        return isinstance(other, DigitSplitVocabulary) and self._base == other._base

    def __hash__(self):
        return hash((type(self).__name__, str(self._base)))

    def __str__(self) -> str:
        return f"DigitSplitVocabulary({self._base})"

    # ---- sizes and special ids: the base vocabulary's ---------------------------------
    @property
    def vocab_size(self) -> int:
        return self._base.vocab_size

    @property
    def _base_vocab_size(self) -> int:
        return self._base.vocab_size

    @property
    def extra_ids(self) -> int:
        return self._base.extra_ids

    @property
    def eos_id(self):
        return self._base.eos_id

    @property
    def unk_id(self):
        return self._base.unk_id

    @property
    def pad_id(self) -> int:
        return self._base.pad_id

    @property
    def bos_id(self):
        try:
            return self._base.bos_id
        except NotImplementedError:
            return None

    # ---- pieces ----------------------------------------------------------------------
    def _sp(self):
        return getattr(self._base, "tokenizer", None) if isinstance(
            self._base, seqio.SentencePieceVocabulary) else None

    def _build_tables(self):
        """`(pieces, piece -> id, splittable mask)` over the whole vocabulary."""
        if self._tables is not None:
            return self._tables
        sp = self._sp()
        pieces: list[str] = []
        splittable = np.zeros(self.vocab_size, dtype=bool)
        for i in range(self.vocab_size):
            if sp is not None and i < sp.get_piece_size():
                piece = sp.id_to_piece(i)
                # Special, unknown, byte-fallback (<0x31>) and extra-id pieces are never split.
                normal = not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i)
                              or sp.is_unused(i) or piece.startswith("<extra_id_"))
            else:
                piece = self._base.decode([i]) if i not in (self.pad_id, self.eos_id) else ""
                normal = i != self.unk_id and i < self._base._base_vocab_size
            pieces.append(piece)
            splittable[i] = normal and len(piece) > 1 and bool(_HAS_DIGIT.search(piece))
        lookup: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            if piece and piece not in lookup and i not in (self.pad_id, self.eos_id, self.unk_id):
                lookup[piece] = i
        self._tables = (pieces, lookup, splittable)
        return self._tables

    def id_to_piece(self, i: int) -> str:
        """The string of token `i` (SentencePiece piece, or the decoded token)."""
        pieces, _, _ = self._build_tables()
        if not 0 <= int(i) < len(pieces):
            raise ValueError(f"expected a token id in [0, {len(pieces)}), got {i}")
        return pieces[int(i)]

    def _split_piece(self, piece: str, original: int) -> list[int]:
        _, lookup, _ = self._build_tables()
        chars = [lookup.get(c) for c in piece]
        if all(c is not None for c in chars):
            return chars  # the paper's rule: one token per character
        out: list[int] = []
        for run in _DIGIT_OR_RUN.findall(piece):
            if run in lookup:
                out.append(lookup[run])
            elif all(c in lookup for c in run):
                out.extend(lookup[c] for c in run)
            else:
                return [original]  # cannot be split without unknown tokens
        return out

    # ---- seqio.Vocabulary ------------------------------------------------------------
    def _encode(self, s: str) -> Sequence[int]:
        _, _, splittable = self._build_tables()
        out: list[int] = []
        for i in self._base.encode(s):
            if 0 <= i < len(splittable) and splittable[i]:
                out.extend(self._split_piece(self.id_to_piece(i), i))
            else:
                out.append(int(i))
        return out

    def decode(self, ids):
        return self._base.decode(ids)

    def _decode(self, ids):
        return self._base.decode(ids)

    def decode_tf(self, ids):
        return self._base.decode_tf(ids)

    def _decode_tf(self, ids):
        return self._base.decode_tf(ids)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        return _encode_tf(self._encode, s)


def _encode_tf(encode, s) -> tf.Tensor:
    """`encode` (a Python `str -> ids`) on a scalar (-> `[n]`) or 1-D (-> ragged
    `[b, None]`) tf.string tensor."""
    s = tf.convert_to_tensor(s, dtype=tf.string)

    def encode_one(x):
        x = x.item() if isinstance(x, np.ndarray) else x  # 0-d bytes array
        return np.asarray(encode(x.decode("utf-8")), dtype=np.int32)

    def encode_scalar(x):
        ids = tf.numpy_function(encode_one, [x], tf.int32, stateful=False)
        ids.set_shape([None])
        return ids

    if s.shape.rank == 0:
        return encode_scalar(s)
    if s.shape.rank == 1:
        return tf.map_fn(encode_scalar, s, fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))
    raise ValueError(f"expected a scalar or 1-D string tensor, got shape {s.shape}")


def _decode_tf(decode, ids) -> tf.Tensor:
    """`decode` (a Python `ids -> str`) on `[n]` (-> a scalar) or `[b, n]` (-> `[b]`) ids."""
    ids = tf.convert_to_tensor(ids, dtype=tf.int32)

    def decode_one(row):
        return np.asarray(decode(row.tolist()).encode("utf-8"), dtype=object)

    def decode_row(row):
        text = tf.numpy_function(decode_one, [row], tf.string, stateful=False)
        text.set_shape([])
        return text

    if ids.shape.rank == 1:
        return decode_row(ids)
    if ids.shape.rank == 2:
        return tf.map_fn(decode_row, ids, fn_output_signature=tf.TensorSpec([], tf.string))
    raise ValueError(f"expected 1-D or 2-D ids, got shape {ids.shape}")


class RtSeqioVocabulary(seqio.Vocabulary):
    """The Regression Transformer's vocabulary (`ntl_jax.data.rt_vocabulary`) as a seqio
    vocabulary: the shipped SentencePiece model with the RT pieces `_d_p_` (digit d at
    place p) after its ids, every digit of a number one RT token. Ids, encoding and
    decoding are the trainer's RT vocabulary's, in Python and in TensorFlow; a number
    with a digit beyond the places of the pieces file is an error, never a wrong token.
    `number_tokens()` values each RT token at its digit, whatever its place (the
    authors' `ignore_order=True`).

    Examples:
      >>> vocab = rt_vocabulary()
      >>> [vocab.id_to_piece(i) for i in vocab.encode("-12.5")]
      ['▁-', '_1_1_', '_2_0_', '_5_-1_']
      >>> vocab.decode(vocab.encode("-12.5"))
      '-12.5'
    """

    def __init__(self, rt: rt_vocabulary_lib.RtVocabulary | None = None):
        self._rt = rt if rt is not None else rt_vocabulary_lib.vocabulary()
        super().__init__(extra_ids=0)

    @property
    def rt(self) -> rt_vocabulary_lib.RtVocabulary:
        return self._rt

    def __eq__(self, other):
        return isinstance(other, RtSeqioVocabulary) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))

    def __str__(self) -> str:
        return f"RtSeqioVocabulary({self._rt.pieces_path}, places {self._rt.max_place}..{self._rt.min_place})"

    @property
    def _base_vocab_size(self) -> int:
        return self._rt.vocab_size

    @property
    def eos_id(self) -> int:
        return self._rt.eos_id

    @property
    def unk_id(self) -> int:
        return self._rt.unk_id

    @property
    def pad_id(self) -> int:
        return self._rt.pad_id

    def id_to_piece(self, i: int) -> str:
        return self._rt.id_to_piece(i)

    def number_tokens(self):
        return self._rt.number_tokens()

    def _encode(self, s: str) -> Sequence[int]:
        return self._rt.encode(s)

    def _decode(self, ids):
        return self._rt.decode(ids)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        return _encode_tf(self._encode, s)

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        return _decode_tf(self._decode, ids)


def rt_vocabulary() -> RtSeqioVocabulary:
    """The Regression Transformer's vocabulary of the trainer, as a seqio vocabulary."""
    return RtSeqioVocabulary()
