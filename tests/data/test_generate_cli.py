"""`ntl-jax generate`: bad flags are refused up front with a message that names the flag."""

import pytest

from ntl_jax import cli

SMALL = ["--modules", "numbers__place_value", "--per-train-module", "3",
         "--per-test-module", "1", "--workers", "1", "--no-progress"]


def with_flag(argv, flag, value):
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@pytest.mark.parametrize("flag, value, message", [
    ("--per-train-module", "2", "expected an integer >= 3 (it is split over the three train difficulties), got 2"),
    ("--per-train-module", "0", "expected an integer >= 3 (it is split over the three train difficulties), got 0"),
    ("--per-test-module", "0", "expected a positive integer, got 0"),
    ("--workers", "0", "expected a positive integer, got 0"),
    ("--workers", "two", "expected a positive integer, got 'two'"),
])
def test_rejects_bad_counts(tmp_path, capsys, flag, value, message):
    argv = ["generate", "--output-dir", str(tmp_path / "out")] + with_flag(SMALL, flag, value)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["file", "file/below"])
def test_output_dir_that_is_or_is_under_a_file(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--output-dir", str(tmp_path / where)] + SMALL)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --output-dir: expected a directory" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("modules", ["", ",", " , "])
def test_empty_module_selection(tmp_path, capsys, modules):
    argv = ["generate", "--output-dir", str(tmp_path / "out")] + with_flag(SMALL, "--modules", modules)
    assert cli.main(argv) == 2
    assert f"--modules: expected 'all', 'paper13', 'ablation' or module names/prefixes, got {modules!r}" \
        in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("regimes", ["", ",", "train-easy,dev"])
def test_bad_regimes(tmp_path, capsys, regimes):
    argv = ["generate", "--output-dir", str(tmp_path / "out"), "--regimes", regimes] + SMALL
    assert cli.main(argv) == 2
    assert "--regimes: expected a comma-separated subset of" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_files_name_the_overwrite_flag(tmp_path, capsys):
    pytest.importorskip("tqdm")
    existing = tmp_path / "out" / "train-easy" / "numbers__place_value.txt"
    existing.parent.mkdir(parents=True)
    existing.write_text("kept\n")
    assert cli.main(["generate", "--output-dir", str(tmp_path / "out")] + SMALL) == 2
    err = capsys.readouterr().err
    assert "1 file(s) already exist" in err and "pass --overwrite to replace them" in err
    assert "overwrite=True" not in err
    assert existing.read_text() == "kept\n"
