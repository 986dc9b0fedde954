"""A registered SeqIO task or mixture, re-registered with another vocabulary.

Fine-tuning a public T5 checkpoint needs the checkpoint's vocabulary (T5's
SentencePiece model, made digit-level with `ntl_jax.seqio.vocabularies.DigitSplitVocabulary`),
while the `ntl_math_*` tasks tokenize with ntl_jax's own vocabulary. T5X checks that
the task's and the model's vocabularies are equal, so a gin file asks for a copy of
the task on the model's vocabulary:

    MIXTURE_OR_TASK_NAME = @task_variants.with_vocabulary()
    task_variants.with_vocabulary:
      name = 'ntl_math_paper13'
      vocabulary = %VOCABULARY

The copy shares the source, preprocessors, postprocessor and metrics; only the
features' vocabulary changes, and a vocabulary that needs features beyond the ids
(xVal's, `ntl_jax.seqio.xval`) adds its `task_preprocessors` at the end. Registration
happens when gin evaluates the reference, before T5X looks the name up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import seqio


def _same_vocabulary(provider: Any, vocabulary: seqio.Vocabulary) -> bool:
    return all(f.vocabulary == vocabulary for f in provider.output_features.values())


def _task_copy(task: seqio.Task, new_name: str, vocabulary: seqio.Vocabulary) -> None:
    features = {k: dataclasses.replace(f, vocabulary=vocabulary) for k, f in task.output_features.items()}
    # Features a vocabulary needs beyond the ids (xVal's number scales), once.
    extra = [p for p in getattr(vocabulary, "task_preprocessors", ()) if p not in task.preprocessors]
    seqio.TaskRegistry.add(
        new_name,
        source=task.source,
        output_features=features,
        preprocessors=[*task.preprocessors, *extra],
        postprocess_fn=task.postprocessor,
        # The constructor arguments, so legacy metric functions are not wrapped twice.
        metric_fns=list(getattr(task, "_metric_fn_constructor_args", task.metric_fns)),
        metric_objs=list(getattr(task, "_metric_objs_constructor_args", [])),
        shuffle_buffer_size=task.shuffle_buffer_size,
    )


def with_vocabulary(name: str, vocabulary: seqio.Vocabulary, suffix: str = "_t5") -> str:
    """Registers `name + suffix`: task or mixture `name` on `vocabulary`; returns it.

    A mixture's tasks are copied the same way (each `<task> + suffix`) with their
    rates. Calling it again with an equal vocabulary reuses the registration.

    Args:
      name: a registered seqio task or mixture.
      vocabulary: the vocabulary every output feature gets.
      suffix: appended to every copied name.

    Raises:
      TypeError: if `vocabulary` is not a `seqio.Vocabulary`.
      ValueError: if `suffix` is empty or `name` is not registered.
    """
    if not isinstance(vocabulary, seqio.Vocabulary):
        raise TypeError(f"expected a seqio.Vocabulary, got {type(vocabulary).__name__}")
    if not suffix:
        raise ValueError("expected a non-empty suffix (the copy needs a name of its own), got ''")
    try:
        provider = seqio.get_mixture_or_task(name)
    except ValueError as error:
        raise ValueError(f"expected a registered seqio task or mixture, got {name!r} ({error})") from None
    new_name = f"{name}{suffix}"
    if isinstance(provider, seqio.Mixture):
        if new_name in seqio.MixtureRegistry.names():
            seqio.MixtureRegistry.remove(new_name)
        rates = [(with_vocabulary(t.name, vocabulary, suffix), provider.get_rate(t)) for t in provider.tasks]
        seqio.MixtureRegistry.add(new_name, rates)
        return new_name
    if new_name in seqio.TaskRegistry.names():
        if _same_vocabulary(seqio.get_mixture_or_task(new_name), vocabulary):
            return new_name
        seqio.TaskRegistry.remove(new_name)
    _task_copy(provider, new_name, vocabulary)
    return new_name
