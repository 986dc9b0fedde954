"""Deterministic, resumable batches of DeepMind mathematics or multiplication problems.

A run draws a fixed pool of training problems from the offline generator
(`ntl_jax.data.generate.examples`, the same source as the SeqIO tasks' on-the-fly
mode), tokenizes it once with the digit-level vocabulary and then serves batch `s` as a
pure function of `(seed, s)`: epoch `e` visits the pool in the order of a permutation
seeded by `(seed, e)`. Resuming at step `s` therefore sees exactly the batches an
uninterrupted run would, with no iterator state to checkpoint.

Why not the SeqIO pipeline itself: on a 2-core CPU the trainer would spend its time in
TensorFlow's input pipeline and its start-up, and a tf.data iterator would have to be
checkpointed to resume in order. The problems, the vocabulary and the EOS/padding
conventions are the same as the tasks' (`seqio.EncDecFeatureConverter` features).

The module "multiplication" selects the paper's multiplication problems
(`ntl_jax.data.multiplication`) instead of a DeepMind module, and "diabetes"
scikit-learn's diabetes regression data (`ntl_jax.data.diabetes`). With
`DataConfig.architecture == "decoder-only"` a batch holds each question (+EOS) and its
answer (+EOS) as one sequence, with the features of seqio's prefix-LM
`DecoderFeatureConverter` (loss on the answer only, the question attended both ways).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import numpy as np

EOS_ID = 1  # T5 / seqio convention: 0 is padding, 1 is end-of-sequence
EVAL_SPLITS = ("test_interpolate", "test_extrapolate")
MULTIPLICATION = "multiplication"  # the task name of `ntl_jax.data.multiplication`
DIABETES = "diabetes"  # the task name of `ntl_jax.data.diabetes`
ARCHITECTURES = ("encoder-decoder", "decoder-only")  # = network.ARCHITECTURES


def _examples(module: str, split: str, n: int, seed: int) -> list[tuple[str, str]]:
    if module == MULTIPLICATION:
        from ntl_jax.data import multiplication

        return multiplication.examples(split, n, seed)
    if module == DIABETES:
        from ntl_jax.data import diabetes

        return diabetes.examples(split, n, seed)
    from ntl_jax.data import generate  # imported late: pulls in the generator and sympy

    return generate.examples(module, split, n, seed)


def default_example_source() -> Callable[[str, str, int, int], Iterable[tuple[str, str]]]:
    """`examples(module, split, n, seed)`: multiplication problems for the module
    "multiplication", diabetes patients for "diabetes", else the offline mathematics
    generator."""
    return _examples


def check_task(module: str) -> str:
    """Returns `module` if it is "multiplication", "diabetes" or a DeepMind training module."""
    if module in (MULTIPLICATION, DIABETES):
        return module
    from ntl_jax.data import catalogue

    try:
        return catalogue.check_module(module)
    except ValueError as e:
        raise ValueError(f"{e} (or {MULTIPLICATION!r} or {DIABETES!r})") from None


def task_metrics(module: str) -> Callable[[Sequence[str], Sequence[str], Sequence[str]],
                                          dict[str, float]] | None:
    """Extra metrics `fn(questions, targets, predictions)` of a task, or None."""
    if module == MULTIPLICATION:
        from ntl_jax.data import multiplication

        return multiplication.metrics
    if module == DIABETES:
        from ntl_jax.data import diabetes

        return diabetes.metrics
    return None


def default_vocabulary():
    """The digit-split SentencePiece vocabulary shipped with the package."""
    from ntl_jax.data import vocabulary

    return vocabulary.default_vocabulary()


def eval_splits(module: str) -> tuple[str, ...]:
    """The test splits of `module`: test_extrapolate only where the release has one
    (diabetes has none)."""
    from ntl_jax.data import catalogue

    if module == MULTIPLICATION:
        return EVAL_SPLITS
    if module == DIABETES:
        return ("test_interpolate",)
    if module in catalogue.TRAIN_MODULES and module not in catalogue.EXTRAPOLATION_FOR:
        return ("test_interpolate",)
    return EVAL_SPLITS


EVAL_CHOICES = ("test", "validation")
VALIDATION = "validation"  # the split name of `validation_examples`
# The stream of training problems the validation problems come from: a seed no run of
# `compare` uses (its seeds are 0..N-1), so the problems are not a run's own draws.
_VALIDATION_SEED = 1_000_003


def validation_examples(source: Callable, module: str, n: int,
                        pool: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """`n` problems drawn as the training ones are, none of whose questions is in `pool`
    (the run's training problems): a split to choose settings on, never the tests."""
    if module == DIABETES:
        raise ValueError(f"expected a task with a training stream to draw validation problems "
                         f"from (a mathematics module or {MULTIPLICATION!r}), got {DIABETES!r}: its "
                         f"patients are split once into train and test")
    seen = {q for q, _ in pool}
    drawn = [ex for ex in source(module, "train", 2 * n, _VALIDATION_SEED) if ex[0] not in seen]
    if len(drawn) < n:
        raise ValueError(f"expected {n} validation problems outside the training pool, found "
                         f"{len(drawn)} among {2 * n} drawn: ask for fewer (--eval-examples)")
    return drawn[:n]


def _round_up(n: int, multiple: int = 8) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def encode_texts(vocabulary, texts: Sequence[str], length: int) -> tuple[np.ndarray, int]:
    """Token ids + EOS, right-padded with 0 to `[len(texts), length]`; counts truncations."""
    out = np.zeros((len(texts), length), np.int32)
    truncated = 0
    for i, text in enumerate(texts):
        ids = list(vocabulary.encode(text))
        if len(ids) > length - 1:
            truncated += 1
        ids = ids[: length - 1] + [EOS_ID]
        out[i, : len(ids)] = ids
    return out, truncated


def to_features(inputs: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    """The `seqio.EncDecFeatureConverter` features of unpacked `[B, L]` id arrays."""
    decoder_input = np.zeros_like(targets)
    decoder_input[:, 1:] = targets[:, :-1]  # shift right, 0 is BOS
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": decoder_input,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }


def concatenate(inputs: np.ndarray, targets: np.ndarray,
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's input tokens followed by its target tokens, right-padded with 0.

    `inputs` and `targets` are `[B, *]` arrays of ids (0-padded, EOS included). Returns
    the `[B, length]` sequences (default: the shortest that holds every row) and the
    `[B]` prefix lengths (input tokens per row).
    """
    in_len = (inputs > 0).sum(axis=1)
    tgt_len = (targets > 0).sum(axis=1)
    need = int((in_len + tgt_len).max(initial=1))
    length = need if length is None else length
    if need > length:
        raise ValueError(f"a question and answer take {need} tokens, more than {length}")
    out = np.zeros((len(inputs), length), np.int32)
    for i, (p, t) in enumerate(zip(in_len, tgt_len)):
        out[i, :p] = inputs[i, :p]
        out[i, p:p + t] = targets[i, :t]
    return out, in_len.astype(np.int32)


def to_decoder_only_features(sequences: np.ndarray, prefix_lengths: np.ndarray
                             ) -> dict[str, np.ndarray]:
    """seqio's prefix-LM `DecoderFeatureConverter` features of unpacked sequences.

    `sequences` `[B, L]` hold the inputs then the targets (see `concatenate`),
    `prefix_lengths` `[B]` the number of input tokens. The loss weights cover the
    targets only; `decoder_causal_attention` marks the positions that attend
    bidirectionally: the inputs, shifted right, and the position whose decoder input is
    the last input token (it predicts the first target), as in seqio.
    """
    decoder_input = np.zeros_like(sequences)
    decoder_input[:, 1:] = sequences[:, :-1]  # shift right, 0 is BOS
    positions = np.arange(sequences.shape[1])[None, :]
    prefix = np.asarray(prefix_lengths)[:, None]
    return {
        "decoder_input_tokens": decoder_input,
        "decoder_target_tokens": sequences,
        "decoder_loss_weights": ((positions >= prefix) & (sequences > 0)).astype(np.int32),
        "decoder_causal_attention": (positions <= prefix).astype(np.int32),
    }


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What a run trains and evaluates on (all part of a checkpoint's identity)."""

    module: str = "arithmetic__add_sub_multiple"
    train_examples: int = 20_000
    eval_examples: int = 500
    batch_size: int = 64
    seed: int = 0
    max_input_length: int = 160
    max_target_length: int = 32  # DeepMind answers have at most 30 characters, + EOS
    # The network the batches are for: "encoder-decoder" (EncDecFeatureConverter
    # features) or "decoder-only" (prefix-LM DecoderFeatureConverter features).
    architecture: str = "encoder-decoder"
    # "test": score on the task's test splits (`eval_splits`); "validation": on problems
    # drawn like the training ones but outside the run's pool (`validation_examples`).
    eval_split: str = "test"


@dataclasses.dataclass
class EvalSet:
    inputs: np.ndarray  # [n, Lin] int32: question ids + EOS (the prompt when decoder-only)
    questions: list[str]
    answers: list[str]
    # Task metrics `fn(questions, targets, predictions) -> {name: value}`, added to the
    # number metrics by `evaluate.evaluate` (e.g. MAPE for multiplication).
    metrics_fn: Callable[[Sequence[str], Sequence[str], Sequence[str]],
                         dict[str, float]] | None = None


class ProblemData:
    """The question/answer problems of a run, tokenized: a training pool and evaluation
    sets, for any mathematics module or `multiplication`; `batch(step)` is deterministic."""

    def __init__(self, config: DataConfig, vocabulary: Any = None,
                 example_source: Callable | None = None):
        if config.batch_size < 1 or config.train_examples < config.batch_size:
            raise ValueError(f"expected 1 <= batch_size <= train_examples, got batch_size="
                             f"{config.batch_size}, train_examples={config.train_examples}")
        if config.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got "
                             f"{config.architecture!r}")
        self.config = config
        self.vocabulary = default_vocabulary() if vocabulary is None else vocabulary
        source = default_example_source() if example_source is None else example_source
        if config.eval_split not in EVAL_CHOICES:
            raise ValueError(f"eval_split must be one of {EVAL_CHOICES}, got {config.eval_split!r}")
        train = list(source(config.module, "train", config.train_examples, config.seed))
        if len(train) != config.train_examples:
            raise ValueError(f"the example source gave {len(train)} training problems, "
                             f"expected {config.train_examples}")
        if config.eval_split == VALIDATION:
            evals = {VALIDATION: validation_examples(source, config.module, config.eval_examples,
                                                     train)}
        else:
            # The test sets do not depend on the run's seed: every run is scored on the same.
            evals = {split: list(source(config.module, split, config.eval_examples, 0))
                     for split in eval_splits(config.module)}
        # One static shape for all training batches (no recompilation); each eval set
        # gets its own input length, since extrapolation questions are longer.
        def length(texts: Sequence[str], cap: int) -> int:
            return min(_round_up(1 + max(len(self.vocabulary.encode(t)) for t in texts)), cap)

        all_answers = [a for _, a in train] + [a for s in evals.values() for _, a in s]
        self.input_length = length([q for q, _ in train], config.max_input_length)
        self.target_length = length(all_answers, config.max_target_length)
        self._inputs, _ = encode_texts(self.vocabulary, [q for q, _ in train],
                                       self.input_length)
        self._targets, self.truncated_targets = encode_texts(
            self.vocabulary, [a for _, a in train], self.target_length)
        self.eval_sets = {}
        for split, ex in evals.items():
            questions = [q for q, _ in ex]
            inputs, _ = encode_texts(self.vocabulary, questions,
                                     length(questions, config.max_input_length))
            self.eval_sets[split] = EvalSet(inputs, questions, [a for _, a in ex],
                                            task_metrics(config.module))
        if config.architecture == "decoder-only":
            self._sequences, self._prefix_lengths = concatenate(self._inputs, self._targets)
            self.sequence_length = _round_up(self._sequences.shape[1])
            self._sequences, _ = concatenate(self._inputs, self._targets,
                                             self.sequence_length)
        self._perm_epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.config.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.config.train_examples), epoch
        return self._perm

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """The features of training batch `step` (0-based); a pure function of the step."""
        n, b = self.config.train_examples, self.config.batch_size
        positions = np.arange(step * b, (step + 1) * b)
        idx = np.empty(b, np.int64)
        for epoch in np.unique(positions // n):  # a batch may straddle two epochs
            sel = positions // n == epoch
            idx[sel] = self._permutation(int(epoch))[positions[sel] % n]
        if self.config.architecture == "decoder-only":
            return to_decoder_only_features(self._sequences[idx], self._prefix_lengths[idx])
        return to_features(self._inputs[idx], self._targets[idx])
