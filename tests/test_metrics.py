"""Number metrics against hand-computed values (paper definitions)."""

import math

import numpy as np
import pytest

from ntl_jax.data import metrics

TARGETS = ["10", "-5", "3", "0"]
PREDICTIONS = ["The answer is 12", "-5", "", "2.5"]  # parsed: 12, -5, NaN, 2.5


def test_parse_number_follows_the_paper_parser():
    assert metrics.parse_number("-1747.09") == -1747.09
    assert metrics.parse_number("x is 3 then 41") == 41.0  # the last number
    assert metrics.parse_number("5 - 3") == -3.0  # the paper's regex allows "- 3"
    assert math.isnan(metrics.parse_number(""))
    assert math.isnan(metrics.parse_number("nan"))
    assert math.isnan(metrics.parse_number(None))
    assert metrics.parse_number(b"12") == 12.0
    with pytest.raises(TypeError, match="expected a string"):
        metrics.parse_number(["12"])


def test_number_metrics_hand_computed():
    m = metrics.number_metrics(TARGETS, PREDICTIONS)
    # valid pairs (p, t): (12, 10), (-5, -5), (2.5, 0); errors 2, 0, 2.5
    assert m["number_accuracy"] == pytest.approx(1 / 4)
    assert m["fraction_unparseable"] == pytest.approx(1 / 4)
    assert m["mae"] == pytest.approx(4.5 / 3)
    assert m["mse"] == pytest.approx(10.25 / 3)
    assert m["median_absolute_error"] == pytest.approx(2.0)
    # R^2 = 1 - 10.25 / (1050 / 9): targets 10, -5, 0 have mean 5/3
    assert m["r2"] == pytest.approx(1 - 10.25 / (1050 / 9))
    lt = [math.log10(11), -math.log10(6), 0.0]
    lp = [math.log10(13), -math.log10(6), math.log10(3.5)]
    assert m["log_mae"] == pytest.approx(np.mean(np.abs(np.subtract(lp, lt))))
    ss_res = sum((a - b) ** 2 for a, b in zip(lp, lt))
    ss_tot = sum((b - np.mean(lt)) ** 2 for b in lt)
    assert m["log_r2"] == pytest.approx(1 - ss_res / ss_tot)
    # Pearson by hand: cov 129.1667 / sqrt(145.1667 * 116.6667)
    assert m["pearson"] == pytest.approx(129.16666 / math.sqrt(145.16666 * 116.66666), rel=1e-5)
    assert m["spearman"] == pytest.approx(1.0)  # same order
    assert m["num_examples"] == 4


def test_plain_functions_match_the_dict():
    m = metrics.number_metrics(TARGETS, PREDICTIONS)
    for name in ("number_accuracy", "mae", "mse", "r2", "median_absolute_error", "log_mae",
                 "log_r2", "pearson", "spearman", "fraction_unparseable"):
        assert getattr(metrics, name)(TARGETS, PREDICTIONS) == pytest.approx(m[name]), name


def test_spearman_hand_computed_with_and_without_ties():
    # rank differences -1, 1, -1, 1, 0: rho = 1 - 6 * 4 / (5 * 24) = 0.8
    assert metrics.spearman(["1", "2", "3", "4", "5"], ["2", "1", "4", "3", "5"]) == pytest.approx(0.8)
    # ties share rank 1.5: Pearson of ranks (1.5, 1.5, 3, 4) vs (1, 2, 3, 4) = 4.5 / sqrt(4.5 * 5)
    assert metrics.spearman(["1", "2", "3", "4"], ["1", "1", "2", "3"]) == pytest.approx(4.5 / math.sqrt(22.5))


def test_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    t = rng.integers(-500, 500, size=40)
    p = t + rng.integers(-30, 30, size=40)
    p[::7] = p[3]  # ties
    ts, ps = [str(x) for x in t], [str(x) for x in p]
    assert metrics.spearman(ts, ps) == pytest.approx(stats.spearmanr(p, t).statistic)
    assert metrics.pearson(ts, ps) == pytest.approx(stats.pearsonr(p, t).statistic)


def test_r2_of_perfect_predictions_is_one_and_constant_targets_undefined():
    assert metrics.r2(["1", "2", "4"], ["1", "2", "4"]) == 1.0
    assert math.isnan(metrics.r2(["3", "3"], ["3", "3"]))
    assert metrics.r2(["3", "3"], ["3", "4"]) == -math.inf


def test_robust_to_empty_and_unparseable_predictions():
    m = metrics.number_metrics(["1", "2"], ["", "no number"])
    assert m["number_accuracy"] == 0.0
    assert m["fraction_unparseable"] == 1.0
    for k in ("mae", "mse", "r2", "median_absolute_error", "log_mae", "log_r2"):
        assert math.isnan(m[k]), k
    assert m["pearson"] == 0.0 and m["spearman"] == 0.0  # fewer than two pairs, as the paper
    empty = metrics.number_metrics([], [])
    assert empty["num_examples"] == 0 and math.isnan(empty["mae"])
    assert math.isnan(metrics.exact_match([], [])["exact_match"])


def test_targets_without_numbers_are_left_out_and_predictions_clipped():
    m = metrics.number_metrics(["True", "5"], ["False", "99999999999"])
    assert m["num_examples"] == 1
    assert m["mae"] == pytest.approx(1e10 - 5)


def test_exact_match_and_length_mismatch():
    assert metrics.exact_match(["10", "-5", " 3"], ["10", "-5.0", "3 "]) == {"exact_match": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="expected as many predictions as targets"):
        metrics.number_metrics(["1"], [])
    with pytest.raises(ValueError, match="expected as many predictions as targets"):
        metrics.exact_match(["1"], [])
