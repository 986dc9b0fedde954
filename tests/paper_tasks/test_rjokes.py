"""rJokes' SeqIO tasks on a fixture in the dataset's TSV format (jokes composed for the test)."""

import doctest
import gzip
import math
import pathlib
import re
import shutil

import pytest

seqio = pytest.importorskip("seqio")

from ntl_jax.data.metrics import regression_metrics
from ntl_jax.seqio import vocabularies
from ntl_jax.seqio.paper_tasks import rjokes

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "rjokes"
LENGTHS = {"inputs": 128, "targets": 8}
NAME = "test_rjokes"

EXPECTED = {
    "train": [
        ("Why did the scarecrow get a promotion? He was outstanding in his field.", "3"),
        # Trailing spaces stripped with the line, as the paper's code does.
        ("I told my cactus a joke about deserts. It didn't get the point.", "0"),
        # The release writes a tab inside a joke as backslash + tab; kept as written.
        ("A tab walks into a bar.\\\tThe barkeep says: we only serve spaces here.", "11"),
        ("My café charges 4 € for a croissant — the flakiest thing on the menu is the Wi-Fi.", "1"),
    ],
    "validation": [
        ("What do you call a fish with no eyes? A fsh.", "2"),
        ("Ich habe einen Witz über Zeitreisen, aber ihr mochtet ihn nicht. Naïve Zuhörer!", "7"),
    ],
    "test": [  # from test.tsv.gz
        ("I used to count sheep to fall asleep, but I kept losing at 99.", "10"),
        ("Why don't skeletons fight each other? They don't have the guts.", "0"),
    ],
}


def _examples(name, split, lengths=LENGTHS):
    ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split=split, shuffle=False)
    return list(ds.as_numpy_iterator())


@pytest.fixture(scope="module")
def registered():
    return rjokes.register(str(FIXTURE), name=NAME)


def test_registration_and_splits(registered):
    assert registered == [NAME, NAME + "_byte"]
    for name in registered:
        task = seqio.get_mixture_or_task(name)
        assert list(task.splits) == ["train", "validation", "test"]
        assert task.metric_fns == [regression_metrics]
        assert task.postprocess_fn(" 7 \n", is_target=False) == "7"
    assert seqio.get_mixture_or_task(NAME + "_byte").output_features["targets"].vocabulary == \
        vocabularies.byte_vocabulary()
    assert rjokes.SPLIT_FILES["validation"] == "dev.tsv"


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_inputs_and_targets_are_the_papers(registered, split):
    for name in registered:
        got = [(ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode())
               for ex in _examples(name, split)]
        assert got == EXPECTED[split]
    path = FIXTURE / ("test.tsv.gz" if split == "test" else rjokes.SPLIT_FILES[split])
    assert [(ex["question"], ex["answer"]) for ex in rjokes.read(str(path))] == EXPECTED[split]


def test_tokenized_lengths_with_both_vocabularies(registered):
    byte = _examples(NAME + "_byte", "train")
    # One id per UTF-8 byte + EOS: 71, 63 and 69 ASCII characters; 82 characters in 87
    # bytes (é 2 bytes, € and — 3 each).
    assert [len(ex["inputs"]) for ex in byte] == [72, 64, 70, 88]
    assert [len(ex["inputs"]) for ex in byte] == [len(q.encode()) + 1 for q, _ in EXPECTED["train"]]
    assert [len(ex["targets"]) for ex in byte] == [2, 2, 3, 2]
    assert byte[3]["inputs"].tolist() == [b + 3 for b in EXPECTED["train"][3][0].encode()] + [1]
    assert byte[2]["targets"].tolist() == [ord("1") + 3, ord("1") + 3, 1]
    spm = _examples(NAME, "train")
    vocab = vocabularies.sentencepiece_vocabulary()
    for ex, (q, a) in zip(spm, EXPECTED["train"]):
        assert ex["inputs"].tolist() == vocab.encode(q) + [1]
        assert ex["targets"].tolist() == vocab.encode(a) + [1]
        assert vocab.decode(ex["inputs"].tolist()) == q
    assert [len(ex["inputs"]) for ex in spm] == [40, 39, 47, 55]
    # A score is the word-start piece and then one token per digit, then EOS.
    assert [len(ex["targets"]) for ex in spm] == [3, 3, 4, 3]
    assert [vocab.decode([t]) for t in spm[2]["targets"].tolist()[1:-1]] == ["1", "1"]
    assert [len(ex["inputs"]) for ex in _examples(NAME, "validation")] == [25, 58]
    # Trimmed to the feature length, EOS kept last.
    (short, *_) = _examples(NAME + "_byte", "train", {"inputs": 16, "targets": 8})
    assert len(short["inputs"]) == 16 and short["inputs"][-1] == 1


def test_metrics_against_hand_computed_values():
    targets = ["3", "0", "11", "1"]
    predictions = ["2", " about 1", "9", "not funny"]
    m = rjokes.metrics(targets, predictions)
    assert m["parsed"] == 3 / 4
    # Pairs (3, 2), (0, 1), (11, 9): squared errors 1, 1, 4.
    assert m["rmse"] == pytest.approx(math.sqrt(6 / 3), rel=1e-12)
    # Targets' mean 14/3: deviations -5/3, -14/3, 19/3; predictions' mean 4: -2, -3, 5.
    # Sum of products (10 + 42 + 95) / 3 = 49; squares 582/9 and 38.
    assert m["pearson_r"] == pytest.approx(49 / math.sqrt(582 / 9 * 38), rel=1e-12)
    assert m["pearson_r"] == pytest.approx(0.988471, abs=1e-6)
    nothing = rjokes.metrics(["3", "5"], ["?", "!"])
    assert nothing["parsed"] == 0 and math.isnan(nothing["rmse"]) and math.isnan(nothing["pearson_r"])
    assert math.isnan(rjokes.metrics(["3", "5"], ["4", "4"])["pearson_r"])  # constant predictions


def test_no_directory_names_the_variable(monkeypatch):
    monkeypatch.delenv(rjokes.DATA_DIR_ENV, raising=False)
    (name, _) = rjokes.register(name=NAME + "_nodir")
    with pytest.raises(FileNotFoundError, match=r"NTL_JAX_RJOKES_DIR.*orionw/rJokesData"):
        _examples(name, "train")


def test_the_variable_names_the_directory(monkeypatch):
    monkeypatch.setenv(rjokes.DATA_DIR_ENV, str(FIXTURE))
    (name, _) = rjokes.register(name=NAME + "_env")
    assert [ex["targets_pretokenized"] for ex in _examples(name, "test")] == [b"10", b"0"]


def test_a_missing_split_file_is_named_and_plain_beats_gzip(tmp_path):
    shutil.copy(FIXTURE / "train.tsv", tmp_path / "train.tsv")
    with gzip.open(tmp_path / "train.tsv.gz", "wt", encoding="utf-8") as f:
        f.write("5\tA joke only the gzip'd file holds.\n")
    (name, _) = rjokes.register(str(tmp_path), name=NAME + "_nodev")
    assert len(_examples(name, "train")) == 4
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"expected dev.tsv or dev.tsv.gz in {tmp_path} ($NTL_JAX_RJOKES_DIR), found none")):
        _examples(name, "validation")


@pytest.mark.parametrize("line, message", [
    ("a joke without a score", r"expected '<score><tab><joke>', got 'a joke without a score' "
                               r"\(no tab, or no joke after it\)"),
    ("4\t  ", r"expected '<score><tab><joke>', got '4\\t  '"),
    ("four\tA joke", r"expected a whole-number score \(rJokes has 0 to 11\) before the first tab, got 'four'"),
    ("3.5\tA joke", r"expected a whole-number score .* got '3.5'"),
    ("-1\tA joke", r"expected a whole-number score .* got '-1'"),
])
def test_a_malformed_line_is_named_with_its_file_and_number(tmp_path, line, message):
    path = tmp_path / "train.tsv"
    path.write_text(f"2\tA fine joke.\n\n{line}\n", encoding="utf-8")  # the blank line is skipped, still counted
    pattern = re.escape(f"{path}:3: ") + message
    with pytest.raises(ValueError, match=pattern):
        list(rjokes.read(str(path)))
    (name, _) = rjokes.register(str(tmp_path), name=NAME + "_bad")
    with pytest.raises(Exception, match=pattern):  # raised inside tf.data, which wraps it
        _examples(name, "train")


def test_a_malformed_gzip_line_is_named(tmp_path):
    path = tmp_path / "test.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("1\tFine.\n0\tFine too.\nx\tNot fine.\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: expected a whole-number score")):
        list(rjokes.read(str(path)))


def test_docstring_examples():
    result = doctest.testmod(rjokes)
    assert result.attempted > 0 and result.failed == 0
