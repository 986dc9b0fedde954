"""xVal in SeqIO: every number of a text one `[NUM]` token, its value a feature.

- `XvalSeqioVocabulary` (`xval_vocabulary()`): the shipped digit-level SentencePiece
  model with `[NUM]` after its ids (id 1000), through xVal's text codec
  (`ntl_jax.data.xval_vocabulary`), the ids of the trainer's xVal. `encode` writes each
  number as `[NUM]`. `decode` reads what `ntl_jax.t5x.xval.XvalEncoderDecoderModel`
  predicts: for each position its token and, after it, the float32 bits (as int32) of
  the value at a `[NUM]`; it writes each `[NUM]` as that value (2 decimals, trailing
  zeros dropped), so a task's metrics read numbers.
- `number_scales`: the preprocessor (after `append_eos_after_trim`) that adds
  `<feature>_scale`, float32 aligned with the ids: the log-scaled value at each `[NUM]`
  (`ntl_jax.data.number_scaling`), 1 elsewhere. The vocabulary names it in
  `task_preprocessors`, so the `ntl_math_*_xval` tasks and `task_variants.with_vocabulary`
  copies run it.
- `XvalFeatureConverter`: `seqio.EncDecFeatureConverter` plus `encoder_scale`,
  `decoder_scale` (the targets' scales shifted right, 1 at the start) and
  `target_values` (the targets' scales); unpacked batches only.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from ntl_jax.data.number_scaling import scale_values, unscale_values
from ntl_jax.data.xval_vocabulary import XvalVocabulary, extract_numbers
from ntl_jax.seqio.vocabularies import _decode_tf, _encode_tf

__all__ = ["XvalFeatureConverter", "XvalSeqioVocabulary", "number_scales", "xval_vocabulary"]


def _scaled_numbers(text) -> np.ndarray:
    text = text.item() if isinstance(text, np.ndarray) else text
    return scale_values(extract_numbers(text.decode("utf-8"))[1]).astype(np.float32)


def number_scales(dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
    """Adds `<name>_scale` for each feature on an `XvalSeqioVocabulary`: the scaled value
    of the k-th number of `<name>_pretokenized` at the k-th `[NUM]` of the ids, 1
    elsewhere (a number cut off by trimming has no `[NUM]` and no scale)."""
    def add(example):
        example = dict(example)
        for name, feature in output_features.items():
            vocabulary = feature.vocabulary
            if not isinstance(vocabulary, XvalSeqioVocabulary) or name not in example:
                continue
            ids = example[name]
            values = tf.numpy_function(_scaled_numbers, [example[f"{name}_pretokenized"]], tf.float32,
                                       stateful=False)
            values.set_shape([None])
            where = tf.where(tf.equal(ids, vocabulary.num_id))
            n = tf.minimum(tf.shape(where)[0], tf.shape(values)[0])
            example[f"{name}_scale"] = tf.tensor_scatter_nd_update(
                tf.ones_like(ids, tf.float32), where[:n], values[:n])
        return example

    return dataset.map(add, num_parallel_calls=tf.data.AUTOTUNE)


class XvalSeqioVocabulary(seqio.Vocabulary):
    """xVal's vocabulary: the shipped digit-level SentencePiece model and `[NUM]` (see the
    module docstring for `decode`'s input).

    Examples:
      >>> vocab = xval_vocabulary()
      >>> ids = vocab.encode("What is -4 + 2.5?")
      >>> [vocab.id_to_piece(i) for i in ids if i == vocab.num_id], vocab.num_id, vocab.vocab_size
      (['[NUM]', '[NUM]'], 1000, 1001)
      >>> bits = np.float32(scale_values(12.0)).view(np.int32)
      >>> vocab.decode([vocab.num_id, bits, 1, 0, 5, 0])  # a prediction: [NUM] (12), EOS, ...
      '12'
    """

    task_preprocessors = (number_scales,)

    def __init__(self, codec: XvalVocabulary | None = None):
        if codec is None:
            from ntl_jax.data.vocabulary import default_vocabulary

            codec = XvalVocabulary(default_vocabulary())
        self._codec = codec
        super().__init__(extra_ids=0)

    @property
    def codec(self) -> XvalVocabulary:
        return self._codec

    @property
    def num_id(self) -> int:
        return self._codec.num_id

    def __eq__(self, other):
        return isinstance(other, XvalSeqioVocabulary) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))

    def __str__(self) -> str:
        return f"XvalSeqioVocabulary({self._codec.vocabulary!r})"

    @property
    def _base_vocab_size(self) -> int:
        return self._codec.vocab_size + 1

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def unk_id(self) -> int:
        return 2

    @property
    def pad_id(self) -> int:
        return 0

    def id_to_piece(self, i: int) -> str:
        return "[NUM]" if int(i) == self.num_id else str(self._codec.vocabulary.id_to_piece(int(i)))

    def _encode(self, s: str) -> Sequence[int]:
        return self._codec.encode(s)[0]

    def _decode(self, ids):
        raise NotImplementedError("xVal's ids carry no values: decode reads a prediction's (token, value bits) "
                                  f"pairs, got {len(ids)} plain ids to _decode")

    def decode(self, ids) -> str:
        """A prediction's text: `ids` holds (token, value bits) pairs; up to the first EOS."""
        if isinstance(ids, tf.__internal__.EagerTensor):
            ids = ids.numpy()
        pairs = np.asarray(ids, np.int64).reshape(-1)
        if pairs.size % 2:
            raise ValueError(f"expected (token, value bits) pairs, an even number of ids, got {pairs.size}")
        tokens, bits = pairs[0::2], pairs[1::2].astype(np.int32)
        values = np.where(tokens == self.num_id, unscale_values(bits.view(np.float32).astype(np.float64)), np.nan)
        return self._codec.decode(tokens, values)

    def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        return _decode_tf(self.decode, ids)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        return _encode_tf(self._encode, s)

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        return _decode_tf(self.decode, ids)


def xval_vocabulary() -> XvalSeqioVocabulary:
    """xVal's vocabulary on the shipped SentencePiece model (the trainer's xVal ids)."""
    return XvalSeqioVocabulary()


class XvalFeatureConverter(seqio.EncDecFeatureConverter):
    """`seqio.EncDecFeatureConverter` with xVal's scales: task features `inputs_scale`
    and `targets_scale` (from `number_scales`, trimmed and padded as their ids), model
    features `encoder_scale`, `decoder_scale` and `target_values`.

    Raises:
      ValueError: with `pack=True` (xVal's batches are unpacked: set
        `DatasetConfig.pack = False`).
    """

    TASK_FEATURES = {
        **seqio.EncDecFeatureConverter.TASK_FEATURES,
        "inputs_scale": seqio.FeatureConverter.FeatureSpec(dtype=tf.float32),
        "targets_scale": seqio.FeatureConverter.FeatureSpec(dtype=tf.float32),
    }
    MODEL_FEATURES = {
        **seqio.EncDecFeatureConverter.MODEL_FEATURES,
        "encoder_scale": seqio.FeatureConverter.FeatureSpec(dtype=tf.float32),
        "decoder_scale": seqio.FeatureConverter.FeatureSpec(dtype=tf.float32),
        "target_values": seqio.FeatureConverter.FeatureSpec(dtype=tf.float32),
    }

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError("xVal expected unpacked batches (DatasetConfig.pack = False), got pack=True")
        super().__init__(pack=False, **kwargs)

    @staticmethod
    def _with_scales(task_feature_lengths: Mapping[str, int]) -> dict:
        lengths = dict(task_feature_lengths)
        lengths.setdefault("inputs_scale", lengths["inputs"])
        lengths.setdefault("targets_scale", lengths["targets"])
        return lengths

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        return super().__call__(ds, self._with_scales(task_feature_lengths))

    def _convert_example(self, features: Mapping[str, tf.Tensor]) -> Mapping[str, tf.Tensor]:
        d = dict(super()._convert_example(features))
        targets_scale = features["targets_scale"]
        d["encoder_scale"] = features["inputs_scale"]
        d["decoder_scale"] = tf.concat([tf.ones([1], tf.float32), targets_scale[:-1]], axis=0)
        d["target_values"] = targets_scale
        return d

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
        lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
        lengths.update(encoder_scale=task_feature_lengths["inputs"], decoder_scale=task_feature_lengths["targets"],
                       target_values=task_feature_lengths["targets"])
        return lengths
