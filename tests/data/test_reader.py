"""Release-layout reader: pairing, and errors that name the file, line and command."""

import os

import pytest

from ntl_jax.data import reader


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_read_pairs(tmp_path):
    p = _write(str(tmp_path / "train-easy" / "m.txt"), "What is 1 + 1?\n2\n0.09 + 1747\n1747.09\n")
    assert list(reader.read_pairs(p)) == [("What is 1 + 1?", "2"), ("0.09 + 1747", "1747.09")]


@pytest.mark.parametrize("text, line, what", [
    ("q1\na1\nq2\n", 3, "question without an answer"),
    ("q1\na1\nq2\n\n", 4, "empty answer"),
    ("q1\na1\n\na2\n", 3, "empty question"),
])
def test_read_pairs_errors_name_file_and_line(tmp_path, text, line, what):
    p = _write(str(tmp_path / "bad.txt"), text)
    with pytest.raises(ValueError, match=f"{p}:{line}: {what}"):
        list(reader.read_pairs(p))


@pytest.mark.parametrize("text, line, what", [
    ("q1\na1\nq2\n", 3, "question without an answer"),
    ("q1\na1\nq2\n \n", 4, "empty answer"),
])
def test_read_pairs_tf_errors_name_file_and_line(tmp_path, text, line, what):
    tf = pytest.importorskip("tensorflow")
    p = _write(str(tmp_path / "bad.txt"), text)
    ds = reader.read_pairs_tf(tf.constant(p))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{p}:{line}: {what}"):
        list(ds.as_numpy_iterator())


def test_read_pairs_tf_skip_take(tmp_path):
    tf = pytest.importorskip("tensorflow")
    p = _write(str(tmp_path / "m.txt"), "".join(f"q{i}\na{i}\n" for i in range(5)))
    got = [(e["question"].decode(), e["answer"].decode())
           for e in reader.read_pairs_tf(tf.constant(p), 1, 2).as_numpy_iterator()]
    assert got == [("q1", "a1"), ("q2", "a2")]


def test_missing_folder_names_layout_and_command(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError) as e:
        reader.check_files(missing, [reader.module_path(missing, "train-easy", "arithmetic__mul")],
                           "arithmetic__mul")
    msg = str(e.value)
    assert missing in msg
    assert "train-easy/<module>.txt" in msg and "extrapolate/" in msg
    assert f"ntl-jax generate --output-dir {missing} --modules arithmetic__mul" in msg


def test_missing_file_is_named(tmp_path):
    _write(str(tmp_path / "train-easy" / "a.txt"), "q\na\n")
    want = reader.module_path(str(tmp_path), "interpolate", "a")
    with pytest.raises(FileNotFoundError, match="interpolate/a.txt"):
        reader.check_files(str(tmp_path), [reader.module_path(str(tmp_path), "train-easy", "a"), want])
    with pytest.raises(ValueError, match="expected a regime"):
        reader.module_path(str(tmp_path), "train", "a")
