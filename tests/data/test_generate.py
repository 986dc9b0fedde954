"""Offline generator: compatibility shims, determinism, release layout, command."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mathematics_dataset")

from ntl_jax.data import (
    catalogue,  # noqa: E402
    generate,  # noqa: E402
    reader,  # noqa: E402
)


def test_catalogue_matches_the_generator():
    flat = {r: set(generate._module_table(r)) for r in ("train-easy", "interpolate", "extrapolate")}
    assert flat["train-easy"] == set(catalogue.TRAIN_MODULES)
    assert flat["interpolate"] == set(catalogue.INTERPOLATE_MODULES)
    assert flat["extrapolate"] == set(catalogue.EXTRAPOLATE_MODULES)
    assert set(catalogue.PAPER13_MODULES) <= set(catalogue.TRAIN_MODULES)
    assert len(catalogue.PAPER13_MODULES) == 13 and len(catalogue.PAPER13_EXTRAPOLATE) == 7
    assert catalogue.EXTRAPOLATION_FOR[catalogue.ABLATION_MODULE] == catalogue.ABLATION_EXTRAPOLATE


def test_select_modules():
    assert catalogue.select_modules("ablation") == (("arithmetic__add_sub_multiple",),
                                                    ("arithmetic__add_sub_multiple_longer",))
    train, extra = catalogue.select_modules("numbers__round,arithmetic__mixed_longer")
    assert train == ("numbers__round_number", "numbers__round_number_composed")
    assert extra == ("arithmetic__mixed_longer", "numbers__round_number_big")
    with pytest.raises(ValueError, match="got 'nope'"):
        catalogue.select_modules("nope")


def test_modules_that_need_the_numpy2_and_sympy_shims_generate():
    # polynomials use ndarray.itemset (numpy 2 removed it); linear_2d the moved sympy function.
    (q, a), = generate.examples("polynomials__expand", "train", 1)
    assert q and a
    (q, a), = generate.examples("algebra__linear_2d", "train", 1)
    assert q.startswith("Solve") and int(a) == int(a)


def test_examples_are_deterministic_and_position_independent():
    first = generate.examples("arithmetic__add_sub_multiple", "train", 6, seed=3)
    # Re-generate after other draws, and from an offset stream: same pairs.
    generate.examples("numbers__is_prime_composed", "train", 2)
    again = generate.examples("arithmetic__add_sub_multiple", "train", 6, seed=3)
    assert first == again
    parts = generate.split_parts("arithmetic__add_sub_multiple", "train")
    assert [p[3] for p in parts] == [catalogue.VALIDATION_PER_DIFFICULTY] * 3
    assert generate.examples("arithmetic__add_sub_multiple", "train", 6, seed=4) != first
    for q, a in first:
        assert len(q) <= catalogue.MAX_QUESTION_LENGTH and len(a) <= catalogue.MAX_ANSWER_LENGTH


def test_same_pairs_in_another_process_with_another_hash_seed():
    code = ("from ntl_jax.data import generate as g; "
            "print(repr(g.examples('numbers__is_prime_composed', 'train', 3) + "
            "g.examples('algebra__linear_1d_composed', 'test_interpolate', 3)))")
    outs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        outs.append(subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                                   capture_output=True, text=True, check=True).stdout)
    here = repr(generate.examples("numbers__is_prime_composed", "train", 3)
                + generate.examples("algebra__linear_1d_composed", "test_interpolate", 3))
    assert outs[0] == outs[1] == here + "\n"


def test_split_parts_and_errors():
    assert generate.split_parts("arithmetic__mul", "test_extrapolate", test_size=5) == [
        ("extrapolate", "arithmetic__mul_big", "extrapolate", 0, 5)]
    val = generate.split_parts("arithmetic__mul", "validation", validation_per_difficulty=2)
    assert val == [(r, "arithmetic__mul", "train", 0, 2) for r in catalogue.TRAIN_REGIMES]
    with pytest.raises(ValueError, match="extrapolation set"):
        generate.split_parts("algebra__linear_1d", "test_extrapolate")
    with pytest.raises(ValueError, match="expected a split"):
        generate.split_parts("algebra__linear_1d", "dev")
    with pytest.raises(ValueError, match="expected a mathematics module"):
        generate.examples("arithmetic__nope", "train", 1)


def test_write_release_layout_matches_streams_and_workers(tmp_path):
    mods, extra = ["arithmetic__add_or_sub"], ["arithmetic__add_or_sub_big"]
    one = generate.write_release(str(tmp_path / "one"), mods, extra, per_train_module=6,
                                 per_test_module=2, workers=1, progress=False, chunk_size=1)
    two = generate.write_release(str(tmp_path / "two"), mods, extra, per_train_module=6,
                                 per_test_module=2, workers=2, progress=False, chunk_size=1)
    rel = sorted(os.path.relpath(p, tmp_path / "one") for p in one)
    assert rel == ["extrapolate/arithmetic__add_or_sub_big.txt",
                   "interpolate/arithmetic__add_or_sub.txt",
                   "train-easy/arithmetic__add_or_sub.txt",
                   "train-hard/arithmetic__add_or_sub.txt",
                   "train-medium/arithmetic__add_or_sub.txt"]
    for a, b in zip(one, two):
        assert open(a).read() == open(b).read()
    easy = list(reader.read_pairs(str(tmp_path / "one" / "train-easy" / "arithmetic__add_or_sub.txt")))
    assert easy == generate.examples("arithmetic__add_or_sub", "train-easy", 2)
    # validation = head of each difficulty file, taken in turn
    val = generate.examples("arithmetic__add_or_sub", "validation", 3, validation_per_difficulty=1)
    assert val[0] == easy[0]
    ext = list(reader.read_pairs(str(tmp_path / "one" / "extrapolate" / "arithmetic__add_or_sub_big.txt")))
    assert ext == generate.examples("arithmetic__add_or_sub", "test_extrapolate", 2)
    with pytest.raises(FileExistsError, match="overwrite"):
        generate.write_release(str(tmp_path / "one"), mods, extra, per_train_module=6,
                               per_test_module=2, progress=False)


def test_generate_command(tmp_path, capsys):
    from ntl_jax import cli

    out = tmp_path / "math"
    rc = cli.main(["generate", "--output-dir", str(out), "--modules", "numbers__place_value",
                   "--per-train-module", "3", "--per-test-module", "1", "--workers", "1",
                   "--no-progress"])
    assert rc == 0
    assert "wrote 5 files" in capsys.readouterr().out
    pairs = list(reader.read_pairs(str(out / "extrapolate" / "numbers__place_value_big.txt")))
    assert len(pairs) == 1
    assert cli.main(["generate", "--output-dir", str(out), "--modules", "bogus"]) == 2
    assert "got 'bogus'" in capsys.readouterr().err


SIX_MODULES = ("probability__swr_p_sequence", "polynomials__evaluate_composed",
               "algebra__linear_2d_composed", "numbers__place_value", "comparison__sort")


def test_generator_without_six_gives_the_same_pairs():
    """`six` is stood in for while the generator imports, where it is not installed."""
    code = ("import json, sys; sys.modules['six'] = None\n"
            "from ntl_jax.data import generate\n"
            "pairs = {m: generate.examples(m, 'train', 3, seed=7) for m in sys.argv[1:]}\n"
            "assert sys.modules['six'] is None and 'six.moves' not in sys.modules\n"
            "print(json.dumps(pairs))")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code, *SIX_MODULES], check=True, cwd=root,
                         capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    for module in SIX_MODULES:
        assert [tuple(p) for p in got[module]] == list(generate.examples(module, "train", 3, seed=7))
