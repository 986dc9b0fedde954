"""The diabetes regression task: texts, splits, the cycling rule, metrics, a training smoke run."""

import doctest
import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("sklearn")

from ntl_jax.data import diabetes

QUESTION_0 = "age 59 sex 2 bmi 32.1 bp 101 s1 157 s2 93.2 s3 38 s4 4 s5 4.8598 s6 87"


def _values(question):
    words = question.split()
    assert tuple(words[0::2]) == diabetes.FEATURES
    return [float(w) for w in words[1::2]]


def test_known_patients_and_every_text_is_exact():
    x, y = diabetes.load()
    assert x.shape == (442, 10) and y.shape == (442,)
    assert diabetes.question(x[0]) == QUESTION_0 and y[0] == 151
    # patient 1 of the release: 48 1 21.6 87 183 103.2 70 3 3.8918 69 -> 75
    assert diabetes.question(x[1]) == "age 48 sex 1 bmi 21.6 bp 87 s1 183 s2 103.2 s3 70 s4 3 s5 3.8918 s6 69"
    assert y[1] == 75 and y.min() == 25 and y.max() == 346
    # The texts hold the release's values exactly (at most 4 decimals there).
    for row in x:
        assert _values(diabetes.question(row)) == row.tolist()
    assert diabetes.format_value(65.3333333) == "65.3333"  # rounded, not cut, to 4 decimals
    assert diabetes.format_value(2.00005) in ("2", "2.0001")  # binary rounding either way
    with pytest.raises(ValueError, match="expected 10 measurements, got 2"):
        diabetes.question([1, 2])


def test_splits_sizes_disjoint_and_fixed():
    train, test = diabetes.split_patients("train"), diabetes.split_patients("test_interpolate")
    assert len(train) == 354 and len(test) == 88
    assert not set(train.tolist()) & set(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(442))
    # every call and every run seed: the same split (the trainer draws test sets with seed 0)
    x, y = diabetes.load()
    texts = {diabetes.question(x[i]) for i in test}
    for seed in (0, 1, 7):
        train_q = {q for q, _ in diabetes.examples("train", 2000, seed)}
        assert train_q == {diabetes.question(x[i]) for i in train}
        assert not train_q & texts
        assert [q for q, _ in diabetes.examples("test_interpolate", 88, seed)] == [
            diabetes.question(x[i]) for i in test]
    # another split seed, another split; the same one again, the same
    other = diabetes.split_patients("test_interpolate", split_seed=1)
    assert len(other) == 88 and set(other.tolist()) != set(test.tolist())
    assert np.array_equal(diabetes.split_patients("test_interpolate", 1), other)
    assert diabetes.examples("test_interpolate", 5, 0, split_seed=1) == [
        (diabetes.question(x[i]), str(y[i])) for i in other[:5]]
    with pytest.raises(ValueError, match="split must be one of"):
        diabetes.examples("test_extrapolate", 1, 0)


def test_train_order_cycles_by_seed_and_test_is_never_repeated():
    x, y = diabetes.load()
    train = diabetes.split_patients("train")
    long = diabetes.examples("train", 800, seed=3)
    assert diabetes.examples("train", 100, seed=3) == long[:100]  # prefix-stable
    assert long == diabetes.examples("train", 800, seed=3)
    assert diabetes.examples("train", 100, seed=4) != long[:100]
    # each full pass of 354 is a permutation of the training patients seeded by (seed, pass)
    for p in range(2):
        expected = np.random.default_rng([3, p]).permutation(train)
        assert long[354 * p: 354 * (p + 1)] == [(diabetes.question(x[i]), str(y[i])) for i in expected]
    assert long[708:] == [(diabetes.question(x[i]), str(y[i]))
                          for i in np.random.default_rng([3, 2]).permutation(train)[:92]]
    assert diabetes.examples("train", 0, 0) == []
    assert len(diabetes.examples("test_interpolate", 500, 0)) == 88
    assert diabetes.examples("test_interpolate", 3, 0) == diabetes.examples("test_interpolate", 500, 9)[:3]
    with pytest.raises(ValueError, match="n must be an integer >= 0, got -1"):
        diabetes.examples("train", -1, 0)


def test_metrics_against_numpy_and_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    t = rng.integers(25, 347, 40)
    p = t + rng.normal(0, 30, 40)
    preds = [f"{v:.2f}" for v in p]
    preds[3], preds[17] = "no idea", ""  # unparsable: counted in `parsed`, left out of rmse / r
    m = diabetes.metrics(["q"] * 40, [str(v) for v in t], preds)
    keep = np.ones(40, bool)
    keep[[3, 17]] = False
    pr = np.round(p, 2)[keep]
    assert m["parsed"] == pytest.approx(38 / 40)
    assert m["rmse"] == pytest.approx(math.sqrt(np.mean((pr - t[keep]) ** 2)), rel=1e-12)
    assert m["pearson_r"] == pytest.approx(stats.pearsonr(pr, t[keep]).statistic, rel=1e-12)
    # the last number of a prediction counts, as in ntl_jax.data.metrics
    assert diabetes.metrics(["q"] * 2, ["100", "200"], ["score 1 is 90", "210"])["rmse"] == pytest.approx(10.0)


def test_metrics_undefined_cases():
    m = diabetes.metrics(["q"] * 3, ["100", "200", "300"], ["150", "150", "150"])
    assert m["rmse"] == pytest.approx(math.sqrt((50 ** 2 + 50 ** 2 + 150 ** 2) / 3))
    assert math.isnan(m["pearson_r"]) and m["parsed"] == 1.0  # constant predictions
    m = diabetes.metrics(["q"] * 2, ["100", "200"], ["?", "x"])
    assert m["parsed"] == 0.0 and math.isnan(m["rmse"]) and math.isnan(m["pearson_r"])
    m = diabetes.metrics(["q"] * 2, ["100", "200"], ["120", "?"])
    assert m == {"parsed": 0.5, "rmse": 20.0, "pearson_r": m["pearson_r"]} and math.isnan(m["pearson_r"])
    assert diabetes.metrics([], [], []) == {}
    with pytest.raises(ValueError, match="as many"):
        diabetes.metrics(["q"], ["1", "2"], ["1"])
    with pytest.raises(ValueError, match="expected a number as every target, got 'n/a'"):
        diabetes.metrics(["q"], ["n/a"], ["1"])


def test_trainer_hooks():
    pytest.importorskip("flax")
    from ntl_jax.train import data as data_lib

    assert data_lib.check_task("diabetes") == "diabetes"
    assert data_lib.eval_splits("diabetes") == ("test_interpolate",)
    assert data_lib.task_metrics("diabetes") is diabetes.metrics
    assert data_lib.default_example_source()("diabetes", "train", 5, 2) == diabetes.examples("train", 5, 2)
    with pytest.raises(ValueError, match="'diabetes'"):
        data_lib.check_task("diabetes_2")


def test_train_micro_run_through_the_cli(tmp_path, capsys):
    pytest.importorskip("flax")
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("sentencepiece")
    from ntl_jax import cli

    out = str(tmp_path / "run")
    argv = ["train", "--module", "diabetes", "--loss", "ntl-was", "--steps", "3", "--out", out,
            "--preset", "micro", "--train-examples", "16", "--eval-examples", "500", "--batch-size", "8",
            "--log-every", "1", "--checkpoint-every", "3", "--no-progress", "--no-tensorboard"]
    assert cli.main(argv) == 0
    assert "step 3, evaluation:" in capsys.readouterr().out
    results = json.load(open(os.path.join(out, "results.json")))
    evals = results["eval"]
    assert evals["test_interpolate/num_examples"] == 88  # the whole test split, once
    assert 0.0 <= evals["test_interpolate/parsed"] <= 1.0
    assert not any(k.startswith("test_extrapolate/") for k in evals)
    preds = json.load(open(os.path.join(out, "predictions.json")))["test_interpolate"]
    x, _ = diabetes.load()
    test = diabetes.split_patients("test_interpolate")
    assert [r["question"] for r in preds] == [diabetes.question(x[i]) for i in test]
    again = diabetes.metrics([r["question"] for r in preds], [r["target"] for r in preds],
                             [r["prediction"] for r in preds])
    for key, value in again.items():  # results.json writes NaN as null
        assert evals[f"test_interpolate/{key}"] == (None if math.isnan(value) else pytest.approx(value))


def test_docstring_examples():
    result = doctest.testmod(diabetes)
    assert result.attempted > 0 and result.failed == 0
