"""GSM8K's SeqIO tasks on a fixture in the official JSONL format (composed for the test)."""

import doctest
import json
import math
import pathlib
import shutil

import pytest

seqio = pytest.importorskip("seqio")

from ntl_jax.seqio import vocabularies  # noqa: E402
from ntl_jax.seqio.paper_tasks import gsm8k  # noqa: E402

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "gsm8k"
LENGTHS = {"inputs": 128, "targets": 128}
NAME = "test_gsm8k"

EXPECTED = {
    "train": [
        ("A baker sells 1200 rolls a week at $0.5 each. How much does she take in a week?",
         "She takes in 1200 * 0.5 = $600 a week.\n#### 600"),
        ("Mia had 48 stickers and gave half of them to Leo. How many does she have left?",
         "She gave away 48 / 2 = 24 stickers.\nShe has 48 - 24 = 24 left.\n#### 24"),
        ("A pool holds 12500 litres. It loses 2750 litres. How many litres are left?",
         "12500 - 2750 = 9750 litres are left.\n#### 9750"),
    ],
    "test": [
        ("Ana walks 3.5 km on Monday and 0.75 km on Tuesday. How far does she walk?",
         "3.5 + 0.75 = 4.25 km.\n#### 4.25"),
        ("The temperature was 4 degrees and fell by 7 degrees. What is it now?",
         "4 - 7 = -3 degrees.\n#### -3"),
    ],
}


def _examples(name, split, lengths=LENGTHS):
    ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split=split, shuffle=False)
    return list(ds.as_numpy_iterator())


@pytest.fixture(scope="module")
def registered():
    return gsm8k.register(str(FIXTURE), name=NAME)


def test_registration_and_splits(registered):
    assert registered == [NAME, NAME + "_byte"]
    for name in registered:
        assert list(seqio.get_mixture_or_task(name).splits) == ["train", "test"]
    assert seqio.get_mixture_or_task(NAME + "_byte").output_features["targets"].vocabulary == \
        vocabularies.byte_vocabulary()


@pytest.mark.parametrize("split", ["train", "test"])
def test_inputs_and_targets_are_the_papers(registered, split):
    got = [(ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode())
           for ex in _examples(NAME, split)]
    assert got == EXPECTED[split]


def test_tokenized_lengths_with_both_vocabularies(registered):
    byte = _examples(NAME + "_byte", "train")
    # One id per character (all ASCII) + EOS: questions of 79, 78 and 74 characters.
    assert [len(ex["inputs"]) for ex in byte] == [80, 79, 75]
    assert [len(ex["targets"]) for ex in byte] == [48, 71, 47]
    assert byte[0]["targets"].tolist() == [b + 3 for b in EXPECTED["train"][0][1].encode()] + [1]
    spm = _examples(NAME, "train")
    vocab = vocabularies.sentencepiece_vocabulary()
    for ex, (q, a) in zip(spm, EXPECTED["train"]):
        assert ex["inputs"].tolist() == vocab.encode(q) + [1]
        assert ex["targets"].tolist() == vocab.encode(a) + [1]
    assert [len(ex["targets"]) for ex in spm] == [36, 50, 35]
    # Every digit of the final answer is one token of its own.
    assert vocab.decode(spm[2]["targets"].tolist()[-5:-1]) == "9750"
    # Trimmed to the feature length, EOS kept last.
    (short, *_) = _examples(NAME + "_byte", "train", {"inputs": 16, "targets": 8})
    assert len(short["targets"]) == 8 and short["targets"][-1] == 1


def test_calculator_annotations_can_be_kept(tmp_path):
    (name, _) = gsm8k.register(str(FIXTURE), calculator_annotations=True, name=NAME + "_calc")
    (ex, *_) = _examples(name, "train")
    assert ex["targets_pretokenized"].decode() == \
        "She takes in 1200 * 0.5 = $<<1200*0.5=600>>600 a week.\n#### 600"


def test_preprocess_numbers_rewrites_only_what_it_matches():
    # The paper's str.replace would also have turned 3.5 into 30.5 here.
    assert gsm8k.preprocess_numbers("3.5 and .5") == "3.5 and 0.5"
    assert gsm8k.preprocess_numbers(".25 of 1,000,000.5") == "0.25 of 1000000.5"
    assert gsm8k.preprocess_numbers("from 1 000 to 10 000 000") == "from 1000 to 10000000"
    # As the paper's patterns: no boundary after a group ("1,2345"), none without three digits.
    assert gsm8k.preprocess_numbers("item 12,34 and 1,2345") == "item 12,34 and 12345"


@pytest.mark.parametrize("text, value", [
    ("so 1,234 in all.\n#### 1,234", 1234.0), ("#### $5.50", 5.5), ("#### -3", -3.0),
    ("#### 7.", 7.0), ("#### -$2", -2.0), ("#### $-2", -2.0), ("#### 0.75 km", 0.75),
    ("#### 3 #### 4", 4.0), ("####12", 12.0), ("the answer is 12", math.nan),
    ("#### twelve", math.nan), ("#### 12,34", math.nan), ("", math.nan),
    (b"#### 9", 9.0),
])
def test_final_answer(text, value):
    got = gsm8k.final_answer(text)
    assert got == value or (math.isnan(got) and math.isnan(value))


def test_metrics_against_hand_computed_values():
    targets = ["... #### 1234", "#### 5.5", "#### -3", "#### 7", "#### 100"]
    predictions = ["... #### 1,234", "#### $5.50", "#### 3", "so 7", "#### 99."]
    m = gsm8k.metrics(targets, predictions)
    assert m["accuracy"] == 2 / 5  # 1,234 and $5.50; "so 7" has no final answer
    assert m["parsed"] == 4 / 5
    assert m["mae"] == pytest.approx((0 + 0 + 6 + 1) / 4, rel=1e-12)
    log = lambda x: math.copysign(math.log10(abs(x) + 1), x)  # noqa: E731
    expected = (abs(log(3) - log(-3)) + abs(log(99) - log(100))) / 4
    assert m["log_mae"] == pytest.approx(expected, rel=1e-12)
    assert math.isnan(gsm8k.metrics(["#### 1"], ["none"])["mae"])
    with pytest.raises(ValueError, match="expected every target to end in '#### <number>', got 'x'"):
        gsm8k.metrics(["x"], ["#### 1"])
    with pytest.raises(ValueError, match="as many predictions as targets"):
        gsm8k.metrics(["#### 1"], [])


def test_no_directory_names_the_variable(monkeypatch):
    monkeypatch.delenv(gsm8k.DATA_DIR_ENV, raising=False)
    (name, _) = gsm8k.register(name=NAME + "_nodir")
    with pytest.raises(FileNotFoundError, match=r"NTL_JAX_GSM8K_DIR.*openai/grade-school-math"):
        _examples(name, "train")


def test_a_missing_split_file_is_named(tmp_path):
    shutil.copy(FIXTURE / "train.jsonl", tmp_path / "train.jsonl")
    (name, _) = gsm8k.register(str(tmp_path), name=NAME + "_notest")
    assert len(_examples(name, "train")) == 3
    with pytest.raises(FileNotFoundError, match=rf"expected test.jsonl in {tmp_path} "
                                                r"\(\$NTL_JAX_GSM8K_DIR\), found none"):
        _examples(name, "test")


@pytest.mark.parametrize("line, message", [
    ('{"question": "q", "answer": "no final answer"}', r"expected an answer ending in '#### <number>'"),
    ('{"question": "q"}', r"expected 'answer' as str, got nothing"),
    ('{"question": 3, "answer": "#### 3"}', r"expected 'question' as str, got int 3"),
    ('{"question": "q", "answer": "#### 1"', r"expected a JSON object"),
    ('["q", "#### 1"]', r"expected a JSON object, got list"),
])
def test_a_malformed_line_is_named_with_its_file_and_number(tmp_path, line, message):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    path = tmp_path / "train.jsonl"
    path.write_text(f"{good}\n\n{line}\n")  # the blank line is skipped, still counted
    pattern = rf"{path}:3: {message}"
    with pytest.raises(ValueError, match=pattern):
        list(gsm8k.read(str(path)))
    (name, _) = gsm8k.register(str(tmp_path), name=NAME + "_bad")
    with pytest.raises(Exception, match=pattern):  # raised inside tf.data, which wraps it
        _examples(name, "train")


def test_docstring_examples():
    result = doctest.testmod(gsm8k)
    assert result.attempted > 0 and result.failed == 0
