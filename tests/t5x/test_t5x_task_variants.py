"""Copies of the mathematics tasks on another vocabulary (skipped without t5x)."""

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
seqio = pytest.importorskip("seqio")
pytest.importorskip("ntl_jax.seqio.tasks")

from ntl_jax.seqio import vocabularies  # noqa: E402
from ntl_jax.t5x import task_variants  # noqa: E402

LENGTHS = {"inputs": 96, "targets": 16}


def test_mixture_copy_tokenizes_with_the_new_vocabulary():
    new_vocab = seqio.ByteVocabulary()
    name = task_variants.with_vocabulary("ntl_math_arithmetic_ablation", new_vocab, "_bytecopy")
    assert name == "ntl_math_arithmetic_ablation_bytecopy"
    (task,) = seqio.get_mixture_or_task(name).tasks
    original = seqio.get_mixture_or_task("ntl_math_ablation__arithmetic__add_sub_multiple")
    assert task.name == original.name + "_bytecopy"
    assert task.output_features["targets"].vocabulary == new_vocab
    assert task.predict_metric_fns == original.predict_metric_fns
    assert len(task.metric_objs) == len(original.metric_objs)
    copy_ex = next(iter(task.get_dataset(LENGTHS, split="validation", shuffle=False)))
    orig_ex = next(iter(original.get_dataset(LENGTHS, split="validation", shuffle=False)))
    # Same example, tokenized byte by byte (+3 offset, EOS 1) instead of by the digit-split vocabulary.
    assert copy_ex["targets_pretokenized"] == orig_ex["targets_pretokenized"]
    text = copy_ex["targets_pretokenized"].numpy().decode()
    assert copy_ex["targets"].numpy().tolist() == [b + 3 for b in text.encode()] + [1]
    assert orig_ex["targets"].numpy().tolist() != copy_ex["targets"].numpy().tolist()


def test_repeated_calls_reuse_the_registration():
    v = vocabularies.DigitSplitVocabulary(seqio.ByteVocabulary())
    first = task_variants.with_vocabulary("ntl_math_arithmetic__mul", v, "_again")
    task = seqio.get_mixture_or_task(first)
    vocabulary = vocabularies.DigitSplitVocabulary(seqio.ByteVocabulary())
    assert task_variants.with_vocabulary("ntl_math_arithmetic__mul", vocabulary, "_again") == first
    assert seqio.get_mixture_or_task(first) is task


@pytest.mark.parametrize(
    "args, error",
    [
        (("no_such_task", seqio.ByteVocabulary()), ValueError),
        (("ntl_math_arithmetic__mul", "bytes"), TypeError),
        (("ntl_math_arithmetic__mul", seqio.ByteVocabulary(), ""), ValueError),
    ],
)
def test_bad_arguments_raise(args, error):
    with pytest.raises(error):
        task_variants.with_vocabulary(*args)
