"""MultiRC (Khashabi et al., 2018; SuperGLUE's multi-sentence reading comprehension) as
SeqIO tasks: a passage and a question in, the question's correct answer options out.

Tasks `ntl_multirc` (the shipped SentencePiece vocabulary) and `ntl_multirc_byte`
(`seqio.ByteVocabulary`), splits `train` (5,131 questions) and `validation` (953), read
from SuperGLUE's files `train.jsonl` and `val.jsonl` (in `MultiRC.zip`) in
`$NTL_JAX_MULTIRC_DIR` or `register(data_dir=...)`. Each line is a passage: `{"idx",
"passage": {"text", "questions": [{"question", "idx", "answers": [{"text", "idx",
"label"}, ...]}, ...]}}`. To fine-tune a checkpoint with its own vocabulary, take a copy
of the task on it (`ntl_jax.t5x.task_variants.with_vocabulary`).

Inputs and targets follow the paper's code (tum-ai/number-token-loss,
`data/multirc/preprocess_data.py`), one example per question: `inputs` is
`"<passage, stripped>\\n\\nQuestion: <question, stripped>"` and `targets` the texts of the
options labelled 1, as written, joined by `" | "` (`""` when none is). Each example also
carries, for the metrics, `question_id` (`"<passage idx>-<question idx>"`),
`answer_options` (every option's text) and `answer_labels` (their 0/1 labels). Where we
differ: there is no `test` split, as SuperGLUE's `test.jsonl` has no labels (the paper's
code turned it into examples whose targets are all empty); and a malformed record (no
passage, text, questions or answers, or a label that is not 0 or 1) raises a ValueError
naming the file and line, where the paper's code read a missing label as 0.

Metrics (`metrics`, SuperGLUE's for MultiRC, as fractions): an option is predicted 1 (a
correct answer) when its text (stripped) is one of the prediction's `" | "`-separated parts
(stripped); `exact_match` is the share of questions whose options are all predicted as
labelled, and `f1a` the binary F1 over all options of all questions (the positive class
being label 1). Both look only at the question's options: a part naming no option changes
neither, and options with the same text are predicted alike. For the targets to carry
the options through `seqio.Evaluator`, the postprocessor (`postprocess`) turns a target
into a dict with the options and labels of the example it came from (as T5's MultiRC
postprocessor adds the question's group); a prediction is its text, stripped.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

from ntl_jax.seqio.paper_tasks import files

DATA_DIR_ENV = "NTL_JAX_MULTIRC_DIR"
SOURCE = ("SuperGLUE's files are in https://dl.fbaipublicfiles.com/glue/superglue/data/v2/MultiRC.zip "
          "(unzipped: MultiRC/{train,val}.jsonl)")
SPLIT_FILES = {"train": "train.jsonl", "validation": "val.jsonl"}
NAME = "ntl_multirc"
SEPARATOR = " | "


def examples(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The examples of one passage record, one per question, as the paper builds them;
    a ValueError says what is malformed.

    >>> record = {"idx": 4, "passage": {"text": " Ann is 7. ", "questions": [
    ...     {"question": "How old is Ann? ", "idx": 9, "answers": [
    ...         {"text": "7", "idx": 0, "label": 1}, {"text": "Seven", "idx": 1, "label": 1},
    ...         {"text": "17", "idx": 2, "label": 0}]}]}}
    >>> [ex] = examples(record)
    >>> ex["question"], ex["answer"], ex["question_id"]
    ('Ann is 7.\\n\\nQuestion: How old is Ann?', '7 | Seven', '4-9')
    >>> ex["answer_options"], ex["answer_labels"]
    (['7', 'Seven', '17'], [1, 1, 0])
    """
    passage = record.get("passage")
    if not isinstance(passage, dict) or not isinstance(passage.get("text"), str):
        raise ValueError("expected 'passage' as an object with 'text' as str")
    questions = passage.get("questions")
    if not isinstance(questions, list) or not questions:
        raise ValueError("expected 'passage' to hold 'questions' as a non-empty list")
    for q in questions:
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("idx"), int):
            raise ValueError(f"expected each question as an object with 'question' (str) and 'idx' (int), "
                             f"got {q!r:.80}")
        answers = q.get("answers")
        if not isinstance(answers, list) or not answers:
            raise ValueError(f"expected question {q['idx']} to have 'answers' as a non-empty list")
        for a in answers:
            if not isinstance(a, dict) or not isinstance(a.get("text"), str):
                raise ValueError(f"expected each answer of question {q['idx']} as an object with 'text' (str), "
                                 f"got {a!r:.80}")
            if type(a.get("label")) is not int or a["label"] not in (0, 1):
                raise ValueError(f"expected each answer of question {q['idx']} to have 'label' 0 or 1, "
                                 f"got {a!r:.80}")
        correct = [a["text"] for a in answers if a["label"] == 1]
        yield {"question": f"{passage['text'].strip()}\n\nQuestion: {q['question'].strip()}",
               "answer": SEPARATOR.join(correct),
               "question_id": f"{record['idx']}-{q['idx']}",
               "answer_options": [a["text"] for a in answers],
               "answer_labels": [a["label"] for a in answers]}


def read(path: str) -> Iterator[dict[str, Any]]:
    """The examples of each line of a MultiRC JSONL file (with labels: train or val), in
    order; a ValueError names the file and line of a malformed one."""
    for number, record in files.json_lines(path, {"idx": int, "passage": dict}):
        try:
            yield from examples(record)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def postprocess(text, example=None, is_target=False):
    """seqio postprocessor: a prediction is its text, stripped; a target is a dict with its
    text and the `question_id`, `options` and `labels` of `example` (the task's example,
    numpy values, which seqio passes for targets), in plain Python types.

    >>> import numpy as np
    >>> ex = {"question_id": b"4-9", "answer_options": np.array([b"7", b"17"], object),
    ...       "answer_labels": np.array([1, 0], np.int32)}
    >>> postprocess("7", example=ex, is_target=True)
    {'answer': '7', 'question_id': '4-9', 'options': ['7', '17'], 'labels': [1, 0]}
    >>> postprocess(" 7 | 17 \\n")
    '7 | 17'
    """
    if not is_target:
        return _text(text).strip()
    if example is None or "answer_options" not in example or "answer_labels" not in example:
        raise ValueError("expected the task's example (with 'answer_options' and 'answer_labels') "
                         "to postprocess a MultiRC target")
    return {"answer": _text(text), "question_id": _text(example.get("question_id", "")),
            "options": [_text(o) for o in example["answer_options"]],
            "labels": [int(l) for l in example["answer_labels"]]}


def predicted_labels(options: Sequence[str], prediction: str) -> list[int]:
    """1 for each option whose stripped text is one of the prediction's `" | "`-separated
    parts (stripped), else 0.

    >>> predicted_labels(["7", "Seven ", "17"], " Seven | 7 | 70")
    [1, 1, 0]
    >>> predicted_labels(["7", "17"], "")
    [0, 0]
    """
    parts = {p.strip() for p in _text(prediction).split(SEPARATOR)} - {""}
    return [int(_text(o).strip() in parts) for o in options]


def metrics(targets: Sequence[dict], predictions: Sequence[str]) -> dict[str, float]:
    """seqio metric fn: `exact_match` (share of questions whose options are all predicted
    as labelled) and `f1a` (binary F1 over all options; 0 when there are no positives,
    predicted or gold). `targets` are `postprocess`'s dicts, `predictions` texts.

    >>> t = [{"options": ["7", "Seven", "17"], "labels": [1, 1, 0]},
    ...      {"options": ["yes", "no"], "labels": [0, 0]}]
    >>> metrics(t, ["7 | Seven", ""]), metrics(t, ["7", "no"])
    ({'exact_match': 1.0, 'f1a': 1.0}, {'exact_match': 0.0, 'f1a': 0.5})
    """
    if len(targets) != len(predictions):
        raise ValueError(f"expected as many predictions as targets, got {len(predictions)} "
                         f"predictions for {len(targets)} targets")
    if not len(targets):
        return {"exact_match": math.nan, "f1a": math.nan}
    exact = tp = fp = fn = 0
    for target, prediction in zip(targets, predictions):
        if not isinstance(target, dict) or "options" not in target or "labels" not in target:
            raise ValueError(f"expected each target as postprocess's dict with 'options' and 'labels', "
                             f"got {target!r:.200}")
        gold = list(target["labels"])
        got = predicted_labels(target["options"], prediction)
        exact += got == gold
        tp += sum(g == p == 1 for g, p in zip(gold, got))
        fp += sum(g == 0 and p == 1 for g, p in zip(gold, got))
        fn += sum(g == 1 and p == 0 for g, p in zip(gold, got))
    return {"exact_match": exact / len(targets), "f1a": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}


def register(data_dir: str | None = None, *, name: str = NAME) -> list[str]:
    """(Re-)registers `name` and `name + "_byte"` on the files in `data_dir` (default
    `$NTL_JAX_MULTIRC_DIR`, read when a split is first read); returns the names."""
    import tensorflow as tf

    data_dir = files.resolve_dir(data_dir, DATA_DIR_ENV)
    source = files.function_source(
        list(SPLIT_FILES),
        lambda split: files.find_file(data_dir, [SPLIT_FILES[split]], env=DATA_DIR_ENV, source=SOURCE),
        read,
        {"question": tf.TensorSpec((), tf.string), "answer": tf.TensorSpec((), tf.string),
         "question_id": tf.TensorSpec((), tf.string),
         "answer_options": tf.TensorSpec((None,), tf.string),
         "answer_labels": tf.TensorSpec((None,), tf.int32)})
    return [files.add_task(name + suffix, source, [files.question_answer], byte=bool(suffix),
                           postprocess_fn=postprocess, metric_fns=[metrics])
            for suffix in ("", "_byte")]
