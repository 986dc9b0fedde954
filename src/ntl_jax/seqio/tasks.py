"""SeqIO tasks and mixtures for the DeepMind mathematics data (registered on import).

Names (`<module>` as in `ntl_jax.data.TRAIN_MODULES`):

* `ntl_math_<module>`: the digit-split SentencePiece vocabulary shipped in the package
  (`ntl_jax.seqio.vocabularies.sentencepiece_vocabulary()`); `ntl_math_<module>_byte`:
  `seqio.ByteVocabulary`; `ntl_math_<module>_rt`: the Regression Transformer's
  (`ntl_jax.seqio.vocabularies.rt_vocabulary()`, a token per digit and decimal place);
  `ntl_math_<module>_xval`: xVal's (`ntl_jax.seqio.xval.xval_vocabulary()`, each number
  one `[NUM]` token, with the features `inputs_scale` and `targets_scale`).
  Splits `train`, `validation`, `test_interpolate`, and `test_extrapolate` where the
  module has an extrapolation set.
* `ntl_math_<extrapolation module>` (+ `_byte`, `_rt`, `_xval`) for extrapolation sets whose name is not
  a training module's (e.g. `ntl_math_arithmetic__mixed_longer`): `test_extrapolate` only.
* `ntl_math_ablation__arithmetic__add_sub_multiple` (+ `_byte`, `_rt`, `_xval`): the paper's ablation
  sizes, 33,333 training and 1,000 validation pairs per difficulty.
* Mixtures `ntl_math_paper13` (13 modules, 7 extrapolation sets) and
  `ntl_math_arithmetic_ablation`, each also with `_byte`, `_rt` and `_xval`.

Features `inputs` (question) and `targets` (answer), both with EOS. Data: the
DeepMind release layout under `$NTL_JAX_MATH_DIR` when that is set (see
`ntl-jax generate`), otherwise pairs generated on the fly, deterministic per seed.
`register_tasks(data_dir=...)` re-registers everything from another source.
"""

from __future__ import annotations

import functools
import os
from typing import Mapping, Sequence

import seqio
import tensorflow as tf

from ntl_jax.data import catalogue, metrics, reader
from ntl_jax.seqio import vocabularies, xval

__all__ = ["ABLATION_TASK", "DATA_DIR_ENV", "PREFIX", "REGISTERED", "VOCABULARIES", "MathFileDataSource",
           "register_tasks"]

DATA_DIR_ENV = "NTL_JAX_MATH_DIR"
PREFIX = "ntl_math"
ABLATION_TASK = f"ablation__{catalogue.ABLATION_MODULE}"

# Parts as in ntl_jax.data.generate.split_parts: (regime, module, namespace, start, count).
_Part = tuple


def _to_inputs_targets(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda ex: {"inputs": ex["question"], "targets": ex["answer"]},
                  num_parallel_calls=tf.data.AUTOTUNE)


def _postprocess(text, example=None, is_target=False):
    """Decoded strings are compared as they are, without surrounding whitespace."""
    del example, is_target
    return text.strip() if isinstance(text, str) else text


class MathFileDataSource(seqio.FileDataSource):
    """Release files of one task; each split reads `[start, start + count)` of the pairs
    of each of its files (lines paired inside a file). A missing file raises
    FileNotFoundError naming the layout and the `ntl-jax generate` command."""

    def __init__(self, data_dir: str, split_parts: Mapping[str, Sequence[_Part]],
                 module_hint: str):
        self._data_dir = data_dir
        self._module_hint = module_hint
        self._split_files = {
            split: [(reader.module_path(data_dir, regime, module), start,
                     -1 if count is None else count)
                    for regime, module, _, start, count in parts]
            for split, parts in split_parts.items()
        }
        super().__init__(
            read_file_fn=reader.read_pairs_tf,
            split_to_filepattern={s: [p for p, _, _ in f] for s, f in self._split_files.items()},
            # Pair-level positions matter (validation = file heads): no caching.
            caching_permitted=False,
        )

    def list_shards(self, split: str) -> Sequence[str]:
        return [p for p, _, _ in self._split_files[split]]

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed=None,
                    shard_info=None, *, sequence_length=None, use_cached=False,
                    num_epochs=1) -> tf.data.Dataset:
        del sequence_length, use_cached, num_epochs  # unused, as in FileDataSource
        if split not in self._split_files:
            raise ValueError(f"expected a split in {sorted(self._split_files)}, got {split!r}")
        files = self._split_files[split]
        reader.check_files(self._data_dir, [p for p, _, _ in files], self._module_hint)
        paths, skips, takes = (list(x) for x in zip(*files))
        ds = tf.data.Dataset.from_tensor_slices(
            (tf.constant(paths), tf.constant(skips, tf.int64), tf.constant(takes, tf.int64)))
        if shard_info and shard_info.num_shards > 1:
            if len(files) < shard_info.num_shards:
                raise ValueError(
                    f"expected at least {shard_info.num_shards} files to shard split "
                    f"{split!r}, got {len(files)}")
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        if shuffle:
            ds = ds.shuffle(len(files), seed=seed)
        return ds.interleave(lambda p, s, t: reader.read_pairs_tf(p, s, t),
                             cycle_length=len(files), block_length=1,
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _generated_source(split_parts: Mapping[str, Sequence[_Part]], seed: int):
    """A FunctionDataSource streaming freshly generated pairs, deterministic per seed."""

    def dataset_fn(split: str, shuffle_files: bool, seed_arg=None):
        del shuffle_files, seed_arg  # the stream is fixed by the generation seed
        from ntl_jax.data import generate

        parts = list(split_parts[split])

        def gen():
            for q, a in generate.interleave(parts, seed=seed):
                yield {"question": q, "answer": a}

        spec = tf.TensorSpec((), tf.string)
        return tf.data.Dataset.from_generator(gen, output_signature={"question": spec, "answer": spec})

    def fn(split, shuffle_files, seed=None):
        return dataset_fn(split, shuffle_files, seed)

    sizes = {s: sum(p[4] for p in parts) for s, parts in split_parts.items()
             if all(p[4] is not None for p in parts)}
    return seqio.FunctionDataSource(fn, splits=list(split_parts),
                                    num_input_examples=sizes or None)


# Task name suffix -> the vocabulary of its features.
VOCABULARIES = {"": vocabularies.sentencepiece_vocabulary, "_byte": vocabularies.byte_vocabulary,
                "_rt": vocabularies.rt_vocabulary, "_xval": xval.xval_vocabulary}


def _add_task(name: str, split_parts, *, data_dir, seed, vocabulary, module_hint):
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    if data_dir:
        source = MathFileDataSource(data_dir, split_parts, module_hint)
    else:
        source = _generated_source(split_parts, seed)
    seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[
            _to_inputs_targets,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
            # features a vocabulary needs beyond the ids (xVal's number scales)
            *getattr(vocabulary, "task_preprocessors", ()),
        ],
        output_features=vocabularies.output_features(vocabulary=vocabulary),
        postprocess_fn=_postprocess,
        metric_fns=[metrics.number_metrics, metrics.exact_match],
        shuffle_buffer_size=10_000,
    )


def _add_mixture(name: str, tasks: Sequence[str]):
    if name in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, list(tasks), default_rate=1.0)


def register_tasks(data_dir: str | None = None, *, prefix: str = PREFIX, seed: int = 0,
                   train_per_difficulty: int = catalogue.RELEASE_TRAIN_PER_DIFFICULTY,
                   validation_per_difficulty: int = catalogue.VALIDATION_PER_DIFFICULTY,
                   test_size: int = catalogue.RELEASE_TEST_PER_MODULE,
                   ablation_train_per_difficulty: int = catalogue.ABLATION_TRAIN_PER_DIFFICULTY,
                   ablation_validation_per_difficulty: int = catalogue.ABLATION_VALIDATION_PER_DIFFICULTY,
                   ) -> list[str]:
    """(Re-)registers every mathematics task and mixture; returns their names.

    Args:
      data_dir: root of the release layout; None generates pairs on the fly.
      prefix: name prefix (`ntl_math`); another prefix registers a second set.
      seed: generation seed (on the fly only; files carry the seed they were written with).
      train_per_difficulty: generated training pairs per difficulty (validation
        included), as in the release; ignored for files, which are read whole.
      validation_per_difficulty: pairs at the head of each train difficulty held out
        as `validation` (3 x 333 ~ the paper's 0.05 % of a module).
      test_size: generated pairs per interpolation/extrapolation set.
      ablation_train_per_difficulty: training pairs per difficulty of the ablation task
        (the paper's 33,333), taken from the head of each difficulty's file/stream.
      ablation_validation_per_difficulty: the pairs after those that validate (1,000).
    """
    from ntl_jax.data.generate import split_parts

    train_n = None if data_dir else train_per_difficulty
    test_n = None if data_dir else test_size
    sizes = dict(train_per_difficulty=train_n, validation_per_difficulty=validation_per_difficulty,
                 test_size=test_n)
    names: list[str] = []

    def add(task: str, parts: dict, hint: str):
        for suffix, vocabulary in VOCABULARIES.items():
            name = f"{prefix}_{task}{suffix}"
            _add_task(name, parts, data_dir=data_dir, seed=seed, vocabulary=vocabulary(), module_hint=hint)
            names.append(name)

    for module in catalogue.TRAIN_MODULES:
        splits = ["train", "validation", "test_interpolate"]
        if module in catalogue.EXTRAPOLATION_FOR:
            splits.append("test_extrapolate")
        add(module, {s: split_parts(module, s, **sizes) for s in splits}, module)
    for module in catalogue.EXTRAPOLATE_MODULES:
        if module not in catalogue.TRAIN_MODULES:
            add(module, {"test_extrapolate": split_parts(module, "test_extrapolate", **sizes)},
                module)

    # The ablation: the head of each difficulty file trains, the next pairs validate.
    m = catalogue.ABLATION_MODULE
    n_train = ablation_train_per_difficulty
    n_val = ablation_validation_per_difficulty
    ablation = {
        "train": [(r, m, "train", 0, n_train) for r in catalogue.TRAIN_REGIMES],
        "validation": [(r, m, "train", n_train, n_val) for r in catalogue.TRAIN_REGIMES],
        "test_interpolate": split_parts(m, "test_interpolate", **sizes),
        "test_extrapolate": split_parts(m, "test_extrapolate", **sizes),
    }
    add(ABLATION_TASK, ablation, "ablation")

    for suffix in VOCABULARIES:
        paper13 = [f"{prefix}_{x}{suffix}" for x in catalogue.PAPER13_MODULES]
        # Extrapolation sets of the paper that extend modules outside the 13.
        paper13 += [f"{prefix}_{x}{suffix}" for x in catalogue.PAPER13_EXTRAPOLATE
                    if catalogue.EXTRAPOLATION_OF[x] not in catalogue.PAPER13_MODULES]
        _add_mixture(f"{prefix}_paper13{suffix}", paper13)
        _add_mixture(f"{prefix}_arithmetic_ablation{suffix}", [f"{prefix}_{ABLATION_TASK}{suffix}"])
        names += [f"{prefix}_paper13{suffix}", f"{prefix}_arithmetic_ablation{suffix}"]
    return names


@functools.lru_cache(maxsize=1)
def _register_from_environment() -> tuple[str, ...]:
    return tuple(register_tasks(os.environ.get(DATA_DIR_ENV) or None))


REGISTERED = _register_from_environment()
