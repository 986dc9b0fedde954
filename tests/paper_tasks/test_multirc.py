"""MultiRC's SeqIO tasks on a fixture in SuperGLUE's JSONL format (passages composed for the test)."""

import doctest
import json
import math
import pathlib
import re
import shutil

import numpy as np
import pytest

seqio = pytest.importorskip("seqio")

from ntl_jax.seqio import vocabularies
from ntl_jax.seqio.paper_tasks import multirc

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "multirc"
LENGTHS = {"inputs": 512, "targets": 64}
NAME = "test_multirc"
URL = "https://dl.fbaipublicfiles.com/glue/superglue/data/v2/MultiRC.zip"

BAKERY = ("<b>Sent 1: </b>The bakery on Rue Cler opened in 1987.<br><b>Sent 2: </b>Each morning Chloé "
          "bakes 240 croissants and 75 baguettes.<br><b>Sent 3: </b>On Sundays she bakes 1.5 times as many "
          "croissants.<br>")  # the file's trailing space stripped
RACE = ("<b>Sent 1: </b>Kenji ran the 10 km race in 48 minutes.<br><b>Sent 2: </b>His sister Aiko "
        "finished 3 minutes after him.<br>")
TRAM = ("<b>Sent 1: </b>A ride on the Zürich tram costs 4.40 francs.<br><b>Sent 2: </b>A day pass costs "
        "8.80 francs — as much as two rides.<br>")
CAKE = "Der Kuchen kostet 3 € pro Stück."

# (inputs, targets, question_id, options, labels) of every question, in file order.
EXPECTED = {
    "train": [
        (BAKERY + "\n\nQuestion: How many croissants does Chloé bake on a Sunday?",
         "360 | Three hundred and sixty", "0-0", ["360", "240", "Three hundred and sixty", "1.5"], [1, 0, 1, 0]),
        (BAKERY + "\n\nQuestion: In which year did the bakery open?", "1987", "0-1", ["1987", "1978"], [1, 0]),
        (RACE + "\n\nQuestion: Who won the race?", "", "1-2", ["Kenji", "Aiko"], [0, 0]),  # no correct answer
        # Options joined as written, spaces and all.
        (RACE + "\n\nQuestion: How long did Aiko take?", "51 minutes |  51 min ", "1-3",
         ["51 minutes", "45 minutes", " 51 min "], [1, 0, 1]),
        (RACE + "\n\nQuestion: How far was the race?", "10 km", "1-4", ["10 km"], [1]),
    ],
    "validation": [
        (TRAM + "\n\nQuestion: How much is a day pass?", "8.80 francs | 8.80 francs", "0-0",
         ["8.80 francs", "4.40 francs", "8.80 francs"], [1, 0, 1]),  # a duplicated option
        (TRAM + "\n\nQuestion: Is a day pass cheaper than two rides?", "No", "0-1", ["Yes", "No"], [0, 1]),
        (CAKE + "\n\nQuestion: What does a piece of cake cost?", "3 € | three euros", "1-2",
         ["3 €", "€30", "three euros"], [1, 0, 1]),
    ],
}


def _examples(name, split, lengths=LENGTHS):
    ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split=split, shuffle=False)
    return list(ds.as_numpy_iterator())


def _fields(ex):
    return (ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode(), ex["question_id"].decode(),
            [o.decode() for o in ex["answer_options"]], ex["answer_labels"].tolist())


@pytest.fixture(scope="module")
def registered():
    return multirc.register(str(FIXTURE), name=NAME)


def test_registration_and_splits(registered):
    assert registered == [NAME, NAME + "_byte"]
    for name in registered:
        task = seqio.get_mixture_or_task(name)
        assert list(task.splits) == ["train", "validation"]
        assert task.metric_fns == [multirc.metrics]
        assert task.postprocess_fn(" 7 | 8 \n", is_target=False) == "7 | 8"
    assert seqio.get_mixture_or_task(NAME + "_byte").output_features["targets"].vocabulary == \
        vocabularies.byte_vocabulary()
    assert multirc.SPLIT_FILES == {"train": "train.jsonl", "validation": "val.jsonl"}


def test_the_directory_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(multirc.DATA_DIR_ENV, str(FIXTURE))
    (name, _) = multirc.register(name=NAME + "_env")
    assert [_fields(ex) for ex in _examples(name, "validation")] == EXPECTED["validation"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_inputs_targets_and_options_are_the_papers(registered, split):
    for name in registered:
        assert [_fields(ex) for ex in _examples(name, split)] == EXPECTED[split]
    got = [(ex["question"], ex["answer"], ex["question_id"], ex["answer_options"], ex["answer_labels"])
           for ex in multirc.read(str(FIXTURE / multirc.SPLIT_FILES[split]))]
    assert got == EXPECTED[split]


def test_tokenized_lengths_with_both_vocabularies(registered):
    byte = _examples(NAME + "_byte", "train")
    # One id per UTF-8 byte + EOS: the bakery questions have 262 and 247 characters, two
    # of them é (2 bytes each), so 264 and 249 bytes; the race ones are ASCII. The target
    # of the question without a correct answer is EOS alone.
    assert [len(ex["inputs"]) for ex in byte] == [265, 250, 152, 158, 156]
    assert [len(ex["targets"]) for ex in byte] == [30, 5, 1, 22, 6]
    assert [len(ex["inputs"]) for ex in byte] == [len(e[0].encode()) + 1 for e in EXPECTED["train"]]
    assert [len(ex["targets"]) for ex in byte] == [len(e[1].encode()) + 1 for e in EXPECTED["train"]]
    assert byte[1]["targets"].tolist() == [b + 3 for b in b"1987"] + [1]
    (*_, cake) = _examples(NAME + "_byte", "validation")
    assert len(cake["targets"]) == 17 + 2 * 1 + 1  # 17 characters, the € 3 bytes

    vocab = vocabularies.sentencepiece_vocabulary()
    spm = _examples(NAME, "train")
    for ex, e in zip(spm, EXPECTED["train"]):
        assert ex["inputs"].tolist() == vocab.encode(e[0]) + [1]
        assert ex["targets"].tolist() == vocab.encode(e[1]) + [1]
    assert [len(ex["inputs"]) for ex in spm] == [174, 164, 91, 96, 93]
    assert [len(ex["targets"]) for ex in spm] == [13, 6, 1, 13, 6]
    # Every digit of a number is a token of its own: "1987" is "▁", "1", "9", "8", "7".
    assert [vocab.decode([i]) for i in spm[1]["targets"].tolist()[1:-1]] == ["1", "9", "8", "7"]

    # Trimmed to the lengths passed, EOS kept last.
    short = _examples(NAME, "train", {"inputs": 100, "targets": 8})
    assert [len(ex["inputs"]) for ex in short] == [100, 100, 91, 96, 93]
    assert [len(ex["targets"]) for ex in short] == [8, 6, 1, 8, 6]
    for ex, e in zip(short, EXPECTED["train"]):
        assert ex["inputs"].tolist() == (vocab.encode(e[0]) + [1] if len(vocab.encode(e[0])) < 100
                                         else vocab.encode(e[0])[:99] + [1])
        assert ex["targets"][-1] == 1


def test_the_postprocessor_carries_the_options_of_a_real_example(registered):
    (*_, cake) = _examples(NAME, "validation")
    task = seqio.get_mixture_or_task(NAME)
    target = task.postprocess_fn(cake["targets_pretokenized"].decode(), example=cake, is_target=True)
    assert target == {"answer": "3 € | three euros", "question_id": "1-2",
                      "options": ["3 €", "€30", "three euros"], "labels": [1, 0, 1]}
    assert all(type(l) is int for l in target["labels"])  # plain Python: JSON loggers can write it
    assert json.loads(json.dumps(target)) == target
    assert task.postprocess_fn(" three euros \n", example=cake, is_target=False) == "three euros"
    with pytest.raises(ValueError, match="expected the task's example"):
        task.postprocess_fn("3 €", is_target=True)


def test_metrics_against_hand_computed_values():
    bakery = ["360", "240", "Three hundred and sixty", "1.5"]
    targets = [
        {"options": bakery, "labels": [1, 0, 1, 0]},
        {"options": ["Kenji", "Aiko"], "labels": [0, 0]},
        {"options": ["Kenji", "Aiko"], "labels": [0, 0]},
        {"options": ["51 minutes", "45 minutes", " 51 min "], "labels": [1, 0, 1]},
        {"options": ["8.80 francs", "4.40 francs", "8.80 francs"], "labels": [1, 0, 1]},
        {"options": ["Yes", "No"], "labels": [0, 1]},
    ]
    predictions = ["360 | 1.5", "", "Nobody | Kenji", "51 minutes | 51 min | 3 hours", "8.80 francs", "yes"]
    # Predicted labels, per question, and what they count:
    #   1: [1, 0, 0, 1]  TP 1 ("360"), FP 1 ("1.5"), FN 1 ("Three hundred and sixty"); not exact
    #   2: [0, 0]        nothing to find, nothing named: exact
    #   3: [0, 0] -> [1, 0]  FP 1 ("Kenji"; "Nobody" is no option, ignored); not exact
    #   4: [1, 0, 1]     TP 2 (" 51 min " matches once stripped; "3 hours" ignored): exact
    #   5: [1, 0, 1]     TP 2 (both duplicates named by one part): exact
    #   6: [0, 0]        FN 1 ("yes" is not "Yes"); not exact
    # exact_match = 3 / 6; TP 5, FP 2, FN 2: f1a = 2*5 / (2*5 + 2 + 2) = 10 / 14.
    m = multirc.metrics(targets, predictions)
    assert m["exact_match"] == 0.5
    assert m["f1a"] == pytest.approx(10 / 14, rel=1e-12)
    # Perfect predictions, the no-answer questions predicted "".
    perfect = ["360 | Three hundred and sixty", "", "", "51 minutes |  51 min ", "8.80 francs | 8.80 francs", "No"]
    assert multirc.metrics(targets, perfect) == {"exact_match": 1.0, "f1a": 1.0}
    # Options with the same text and different labels are predicted alike: never exact.
    same = [{"options": ["a", "a"], "labels": [1, 0]}]
    assert multirc.metrics(same, ["a"]) == {"exact_match": 0.0, "f1a": 2 / 3}  # TP 1, FP 1
    assert multirc.metrics(same, [""]) == {"exact_match": 0.0, "f1a": 0.0}  # FN 1
    # No positives at all: exact, and F1 0 (as sklearn's f1_score has it).
    assert multirc.metrics(targets[1:2], [""]) == {"exact_match": 1.0, "f1a": 0.0}
    assert all(math.isnan(v) for v in multirc.metrics([], []).values())
    with pytest.raises(ValueError, match="as many predictions as targets"):
        multirc.metrics(targets, predictions[:2])
    with pytest.raises(ValueError, match="expected each target as postprocess's dict"):
        multirc.metrics(["360"], ["360"])


PREDICTIONS = {  # per question in file order, and what seqio should report
    "train": (["360", "1987", "", "51 minutes | 45 minutes", "10 km"],
              # EM: questions 2, 3 and 5. TP 1 + 1 + 1 + 1 = 4, FP 1 ("45 minutes"),
              # FN 2 ("Three hundred and sixty", " 51 min "): F1 8 / 11.
              {"exact_match": 3 / 5, "f1a": 8 / 11}),
    "validation": (["8.80 francs", "Yes", "3 € | 3 euros"],
                   # EM: question 1. TP 2 + 1, FP 1 ("Yes"), FN 1 ("No") + 1 ("three euros"): F1 6 / 9.
                   {"exact_match": 1 / 3, "f1a": 6 / 9}),
}


@pytest.mark.parametrize("split", ["train", "validation"])
def test_end_to_end_as_seqio_computes_metrics(registered, split):
    """Targets postprocessed with their examples, predictions decoded and postprocessed,
    then the metric fn, as seqio's metric wrapper does for each example."""
    predictions, expected = PREDICTIONS[split]
    task = seqio.get_mixture_or_task(NAME + "_byte")
    vocab = task.output_features["targets"].vocabulary
    examples = _examples(task.name, split)
    targets = [task.postprocess_fn(ex["targets_pretokenized"].decode(), example=ex, is_target=True)
               for ex in examples]
    decoded = [vocab.decode(vocab.encode(p) + [1, 0, 0]) for p in predictions]  # EOS and padding dropped
    got = task.metric_fns[0](targets, [task.postprocess_fn(p, example=ex, is_target=False)
                                       for p, ex in zip(decoded, examples)])
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_seqio_evaluator_reports_the_metrics(registered, split):
    predictions, expected = PREDICTIONS[split]
    vocab = vocabularies.byte_vocabulary()

    def predict_fn(ds):  # the cached eval dataset, as (index, model features) pairs
        out = []
        for index, _ in ds.as_numpy_iterator():
            tokens = vocab.encode(predictions[int(index)]) + [1]
            out.append((int(index), tokens + [0] * (32 - len(tokens))))
        return out

    evaluator = seqio.Evaluator(NAME + "_byte", seqio.EncDecFeatureConverter(pack=False), eval_split=split,
                                sequence_length={"inputs": 512, "targets": 32}, async_compute_metrics=False)
    metrics, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn)
    assert metrics.result()[NAME + "_byte"] == pytest.approx(expected, rel=1e-12)


def test_no_directory_names_the_variable_and_the_zip(monkeypatch):
    monkeypatch.delenv(multirc.DATA_DIR_ENV, raising=False)
    (name, _) = multirc.register(name=NAME + "_nodir")
    with pytest.raises(FileNotFoundError, match=rf"NTL_JAX_MULTIRC_DIR.*{re.escape(URL)}"):
        _examples(name, "train")


def test_a_missing_split_file_is_named(tmp_path):
    shutil.copy(FIXTURE / "train.jsonl", tmp_path / "train.jsonl")
    (name, _) = multirc.register(str(tmp_path), name=NAME + "_noval")
    assert len(_examples(name, "train")) == 5
    with pytest.raises(FileNotFoundError, match=re.escape(f"expected val.jsonl in {tmp_path} "
                                                          "($NTL_JAX_MULTIRC_DIR), found none")):
        _examples(name, "validation")


def _record(question=None, answers=None, **passage):
    q = {"question": "Q?", "idx": 5, "answers": [{"text": "a", "idx": 0, "label": 1}]}
    if question is not None:
        q = question
    if answers is not None:
        q = dict(q, answers=answers)
    return json.dumps({"idx": 2, "passage": {"text": "P.", "questions": [q], **passage}})


@pytest.mark.parametrize("line, message", [
    ('{"idx": 2, "version": 1.1}', "expected 'passage' as dict, got nothing"),
    ('{"passage": {}}', "expected 'idx' as int, got nothing"),
    ('{"idx": 2, "passage": {"text": 3, "questions": []}', "expected a JSON object"),
    ('{"idx": 2, "passage": {"questions": []}}', "expected 'passage' as an object with 'text' as str"),
    ('{"idx": 2, "passage": {"text": "P."}}', "expected 'passage' to hold 'questions' as a non-empty list"),
    (_record(questions=[]), "expected 'passage' to hold 'questions' as a non-empty list"),
    (_record(question={"idx": 5, "answers": []}), "expected each question as an object with 'question' (str)"),
    (_record(question={"question": "Q?", "idx": 5}), "expected question 5 to have 'answers' as a non-empty list"),
    (_record(answers=[]), "expected question 5 to have 'answers' as a non-empty list"),
    (_record(answers=[{"idx": 0, "label": 1}]), "expected each answer of question 5 as an object with 'text'"),
    (_record(answers=[{"text": "a", "idx": 0}]), "expected each answer of question 5 to have 'label' 0 or 1"),
    (_record(answers=[{"text": "a", "idx": 0, "label": 2}]),
     "expected each answer of question 5 to have 'label' 0 or 1, got {'text': 'a', 'idx': 0, 'label': 2}"),
    (_record(answers=[{"text": "a", "idx": 0, "label": "1"}]),
     "expected each answer of question 5 to have 'label' 0 or 1, got {'text': 'a', 'idx': 0, 'label': '1'}"),
])
def test_a_malformed_line_is_named_with_its_file_and_number(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text(f"{_record()}\n\n{line}\n")  # the blank line is skipped, still counted
    assert len(list(multirc.read(str(FIXTURE / "train.jsonl")))) == 5
    pattern = re.escape(f"{path}:3: {message}")
    with pytest.raises(ValueError, match=pattern):
        list(multirc.read(str(path)))
    (name, _) = multirc.register(str(tmp_path), name=NAME + "_bad")
    with pytest.raises(Exception, match=pattern):  # raised inside tf.data, which wraps it
        _examples(name, "train")


def test_a_good_line_before_a_bad_one_is_read(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(f"{_record()}\n{_record(answers=[])}\n")
    got = []
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: ")):
        for ex in multirc.read(str(path)):
            got.append(ex)
    assert got == [{"question": "P.\n\nQuestion: Q?", "answer": "a", "question_id": "2-5",
                    "answer_options": ["a"], "answer_labels": [1]}]


def test_docstring_examples():
    result = doctest.testmod(multirc)
    assert result.attempted > 0 and result.failed == 0


def test_numpy_example_values_are_read(registered):
    # seqio passes the example as numpy values: an object array of bytes and int32 labels.
    ex = {"answer_options": np.array([b"Yes", b"No"], object), "answer_labels": np.array([0, 1], np.int32)}
    target = multirc.postprocess(b"No", example=ex, is_target=True)
    assert target == {"answer": "No", "question_id": "", "options": ["Yes", "No"], "labels": [0, 1]}
    assert multirc.metrics([target], ["No"]) == {"exact_match": 1.0, "f1a": 1.0}
