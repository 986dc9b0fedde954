"""Paired statistics of compare runs, against scipy and brute-force enumeration."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest

from ntl_jax.train import paired_stats as ps

stats = pytest.importorskip("scipy.stats")


# --- bootstrap ---------------------------------------------------------------------------

def test_bootstrap_ci_matches_numpy_reference_and_contains_mean():
    d = np.array([0.10, -0.05, 0.20, 0.15, 0.00, 0.30, 0.05])
    rng = np.random.default_rng(7)
    means = d[rng.integers(0, d.size, size=(5000, d.size))].mean(axis=1)
    ref = np.percentile(means, [2.5, 97.5])

    lo, hi = ps.bootstrap_ci(d, n_resamples=5000, seed=7)
    assert (lo, hi) == (float(ref[0]), float(ref[1]))
    assert lo < d.mean() < hi
    assert 0.0 < lo < 0.05 and 0.15 < hi < 0.25  # the mean is 0.107, the sd of the mean 0.043
    assert ps.bootstrap_ci(list(d), n_resamples=5000, seed=7) == (lo, hi)  # deterministic
    assert ps.bootstrap_ci(d, n_resamples=5000, seed=8) != (lo, hi)
    lo90, hi90 = ps.bootstrap_ci(d, confidence=0.90, n_resamples=5000, seed=7)
    assert lo < lo90 and hi90 < hi


def test_bootstrap_ci_degenerate_cases():
    assert ps.bootstrap_ci([0.25]) == (0.25, 0.25)
    assert ps.bootstrap_ci([-0.1, -0.1, -0.1]) == (-0.1, -0.1)
    with pytest.raises(ValueError):
        ps.bootstrap_ci([])
    with pytest.raises(ValueError):
        ps.bootstrap_ci([0.1, float("nan")])


def test_bootstrap_ci_narrower_with_more_data():
    rng = np.random.default_rng(0)
    small = rng.normal(0.1, 1.0, 10)
    large = rng.normal(0.1, 1.0, 400)
    w_small = np.subtract(*ps.bootstrap_ci(small)[::-1])
    w_large = np.subtract(*ps.bootstrap_ci(large)[::-1])
    # width ~ 2 * 1.96 / sqrt(n): about 1.2 and 0.2
    assert w_large < w_small / 3
    assert 0.1 < w_large < 0.3


# --- Student t --------------------------------------------------------------------------

@pytest.mark.parametrize("df", [*range(1, 41), 57, 100, 1000])
def test_t_quantile_matches_scipy(df):
    for q in (0.025, 0.05, 0.6, 0.9, 0.95, 0.975, 0.995, 0.9995):
        assert ps.t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9)
    assert ps.t_quantile(0.5, df) == 0.0


def test_t_quantile_hand_values_and_bad_input():
    assert ps.t_quantile(0.75, 1) == pytest.approx(1.0, rel=1e-12)       # Cauchy: tan(pi/4)
    # df 2 has a closed form: t = 2a / sqrt(2 (1 - a^2)) with a = 2q - 1
    assert ps.t_quantile(0.975, 2) == pytest.approx(2 * 0.95 / math.sqrt(2 * (1 - 0.95 ** 2)),
                                                    rel=1e-12)
    for q, df in [(0.0, 3), (1.0, 3), (0.9, 0), (0.9, 2.5), (0.9, True)]:
        with pytest.raises(ValueError, match=r"expected (an integer >= 1|a number in \(0, 1\)), got"):
            ps.t_quantile(q, df)


def test_t_interval_matches_scipy_on_mean_and_sem():
    d = np.array([0.012, -0.004, 0.020, 0.007, 0.015, 0.001, 0.009])
    n = d.size
    expected = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=stats.sem(d))
    lo, hi = ps.t_interval(d)
    assert (lo, hi) == pytest.approx(expected, rel=1e-10)
    # by hand: mean 0.0085714, sd 0.0081824, t(0.975, 6) = 2.4469, half-width 0.0075675
    assert (lo, hi) == pytest.approx((0.0010039, 0.0161389), abs=1e-7)
    lo90, hi90 = ps.t_interval(d, confidence=0.90)
    assert (lo90, hi90) == pytest.approx(stats.t.interval(0.90, n - 1, loc=d.mean(),
                                                          scale=stats.sem(d)), rel=1e-10)
    # wider than the bootstrap with few values: the bootstrap ignores the uncertainty of sd
    b_lo, b_hi = ps.bootstrap_ci(d)
    assert hi - lo > b_hi - b_lo


def test_t_interval_degenerate_cases():
    assert ps.t_interval([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert ps.t_interval([-1.0, 1.0]) == pytest.approx((-12.706205, 12.706205), rel=1e-6)
    with pytest.raises(ValueError, match="expected at least two differences, got 1"):
        ps.t_interval([0.2])
    with pytest.raises(ValueError, match="finite"):
        ps.t_interval([0.2, float("inf")])
    with pytest.raises(ValueError, match="confidence"):
        ps.t_interval([0.1, 0.2], confidence=1.0)


# --- the smallest p of the exact tests, Holm ----------------------------------------------

@pytest.mark.parametrize("n", range(1, 13))
def test_min_attainable_p_is_what_the_exact_tests_give_at_their_most_extreme(n):
    extreme = list(np.arange(1.0, n + 1))            # every difference positive
    assert ps.min_attainable_p(n) == ps.wilcoxon_p(extreme) == ps.sign_test_p(extreme)
    assert ps.min_attainable_p(n) == min(1.0, stats.binomtest(n, n, 0.5).pvalue)
    # no data of n pairs gets below it
    rng = np.random.default_rng(n)
    for _ in range(50):
        d = rng.normal(0.5, 1.0, n)
        assert ps.wilcoxon_p(d) >= ps.min_attainable_p(n)
        assert ps.sign_test_p(d) >= ps.min_attainable_p(n)
    assert (ps.min_attainable_p(n) < 0.05) == (n >= 6)
    assert ps.min_attainable_p(0) == 1.0


def _holm_reference(p):
    """Holm from its definition, written independently: for each p_i, the largest over the
    p_j ranked at or before it of min(1, (m - rank_j) p_j), ranks 0-based by (p, index)."""
    m = len(p)
    rank = {i: sum((p[j], j) < (p[i], i) for j in range(m)) for i in range(m)}
    return [max(min(1.0, (m - rank[j]) * p[j]) for j in range(m) if rank[j] <= rank[i])
            for i in range(m)]


def test_holm_hand_fixture():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max
    assert ps.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    assert ps.holm(p) == pytest.approx(_holm_reference(p), rel=1e-12)
    assert ps.holm([0.2, 0.5]) == [0.4, 0.5]
    assert ps.holm([0.9, 0.8]) == [1.0, 1.0]             # capped at 1
    assert ps.holm([0.02]) == [0.02]                     # one test: unchanged
    assert ps.holm([]) == []
    assert ps.holm([0.01, None, 0.04]) == [0.02, None, 0.04]   # None is not a test
    with pytest.raises(ValueError, match=r"expected p-values in \[0, 1\], got 1.5"):
        ps.holm([0.1, 1.5])


def test_holm_matches_the_definition_and_the_step_down_procedure():
    rng = np.random.default_rng(5)
    for m in (2, 3, 6, 24):
        for _ in range(20):
            p = list(rng.uniform(0, 0.2, m) ** 2)
            p[0] = p[-1]                              # a tie
            adjusted = ps.holm(p)
            assert adjusted == pytest.approx(_holm_reference(p), rel=1e-12)
            # Holm's procedure at level a: walk up the sorted p while p_(k) <= a / (m - k);
            # the hypotheses passed are exactly those with adjusted p <= a.
            order = sorted(range(m), key=lambda i: (p[i], i))
            for a in (0.01, 0.05, 0.1):
                rejected = set()
                for k, i in enumerate(order):
                    if p[i] > a / (m - k):
                        break
                    rejected.add(i)
                assert rejected == {i for i in range(m) if adjusted[i] <= a}


# --- sign test ---------------------------------------------------------------------------

@pytest.mark.parametrize("diffs", [
    [1, 2, 3, 4, 5],
    [0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7],
    [0.1, 0.0, 0.2, 1e-13, -0.3, 0.4],        # an exact zero and a near-zero are ties
    [-1] * 9 + [2],
    [1, -1, 1, -1],
    [0.01 * k for k in range(1, 21)],
])
def test_sign_test_matches_binomtest(diffs):
    d = np.asarray(diffs, dtype=float)
    d = d[np.abs(d) > 1e-12]
    k, n = int(np.sum(d > 0)), int(d.size)
    expected = stats.binomtest(k, n, 0.5).pvalue
    assert ps.sign_test_p(diffs) == pytest.approx(expected, rel=1e-12, abs=0)


def test_sign_test_hand_values():
    assert ps.sign_test_p([0.3, 0.1, 0.2, 0.4, 0.5]) == 2 / 32
    assert ps.sign_test_p([0.3, 0.1, 0.2, -0.4]) == 10 / 16
    assert ps.sign_test_p([0.0, 0.0, 1e-13]) == 1.0
    assert ps.sign_test_p([]) == 1.0


# --- Wilcoxon ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(5, 16))
def test_wilcoxon_matches_scipy_exact_without_ties(n):
    rng = np.random.default_rng(100 + n)
    for shift in (0.0, 0.5, -1.0):
        d = rng.normal(shift, 1.0, n)
        assert len(set(np.abs(d))) == n
        expected = stats.wilcoxon(d, method="exact").pvalue
        assert ps.wilcoxon_p(d) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def _brute_force_wilcoxon(d):
    """min(1, 2 min(P(T <= t), P(T >= t))) by enumerating all 2^n signs of the ranks."""
    d = np.asarray(d, dtype=float)
    d = d[d != 0]
    ranks = stats.rankdata(np.abs(d))          # average ranks for ties
    t = ranks[d > 0].sum()
    sums = [sum(r for r, s in zip(ranks, signs) if s)
            for signs in itertools.product((0, 1), repeat=d.size)]
    sums = np.asarray(sums)
    below = np.mean(sums <= t + 1e-9)
    above = np.mean(sums >= t - 1e-9)
    return min(1.0, 2 * min(below, above))


@pytest.mark.parametrize("diffs", [
    [1, 1, 2, -3, 4],
    [0.5, -0.5, 0.5, 0.5, 1.0, 1.0, -2.0, 3.0],
    [0.02, 0.02, 0.02, 0.02, 0.02, -0.02, 0.05, 0.05, 0.01, 0.03],
    [2, 2, 2, 2, 2, 2, 2],
    [3, -3, 1, 1, -1, 2, 0.0, 0.0, 4, 5, 6, 6],   # ties and zeros
])
def test_wilcoxon_with_ties_matches_brute_force(diffs):
    p = ps.wilcoxon_p(diffs)
    assert p == pytest.approx(_brute_force_wilcoxon(diffs), rel=1e-12)


def test_wilcoxon_random_ties_match_brute_force():
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randint(3, 11)
        d = [rng.choice([-3, -2, -1, 0, 1, 2, 3, 4]) * 0.125 for _ in range(n)]
        assert ps.wilcoxon_p(d) == pytest.approx(_brute_force_wilcoxon(d), rel=1e-12)


def test_wilcoxon_hand_values_and_zeros():
    assert ps.wilcoxon_p([1, 2, 3, 4, 5]) == 2 / 32            # only one assignment is as extreme
    assert ps.wilcoxon_p([-1, 2, 3, 4, 5]) == 2 * 2 / 32       # T = 14: T >= 14 in 2 of 32
    assert ps.wilcoxon_p([1, 2, 3, 4, -5]) == 2 * 10 / 32      # T = 10: T >= 10 in 10 of 32
    assert ps.wilcoxon_p([0.0, 0.0]) == 1.0
    d = [0.3, -0.1, 0.7, 0.5, 0.9, 1.1]
    assert ps.wilcoxon_p(d + [0.0, 0.0]) == ps.wilcoxon_p(d)  # zeros dropped ("wilcox")
    assert ps.wilcoxon_p(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)


def test_wilcoxon_rounding_level_ties_share_a_rank():
    # 0.8 - 0.7 and 0.3 - 0.2 differ by float rounding only; they are the same difference
    a, b = 0.8 - 0.7, 0.3 - 0.2
    assert a != b
    assert ps.wilcoxon_p([a, -b, 0.3, 0.4, 0.5]) == ps.wilcoxon_p([0.1, -0.1, 0.3, 0.4, 0.5])
    assert ps.wilcoxon_p([a, -b, 0.3, 0.4, 0.5]) == pytest.approx(
        _brute_force_wilcoxon([0.1, -0.1, 0.3, 0.4, 0.5]))


# --- paired_comparison -------------------------------------------------------------------

ACC = "test_interpolate/number_accuracy"
LMAE = "test_interpolate/log_mae"


def _run(loss, seed, **metrics):
    return {"loss": loss, "seed": seed, "metrics": metrics, "run_dir": f"/x/{loss}/{seed}"}


def test_paired_comparison_pairs_by_seed():
    ce = {0: 0.50, 1: 0.60, 2: 0.70, 3: 0.40, 4: 0.55}
    was = {0: 0.55, 1: 0.58, 2: float("nan"), 3: 0.50}             # seed 4 missing, seed 2 NaN
    runs = [_run("ce", s, **{ACC: v}) for s, v in ce.items()]
    runs += [_run("ntl-was", s, **{ACC: v}) for s, v in was.items()]
    runs += [_run("ntl-mse", 9, **{ACC: 0.9})]                      # no seed in common
    random.Random(0).shuffle(runs)

    out = ps.paired_comparison(runs)
    assert set(out) == {"ntl-was", "ntl-mse"}
    e = out["ntl-was"][ACC]
    diffs = [0.05, -0.02, 0.10]
    assert e["n"] == 3
    assert e["mean_diff"] == pytest.approx(np.mean(diffs), abs=1e-12)
    assert e["baseline"] == "ce"
    lo, hi = e["ci95"]
    assert lo <= e["mean_diff"] <= hi
    d = np.array([0.55 - 0.5, 0.58 - 0.6, 0.5 - 0.4])
    assert (lo, hi) == pytest.approx(stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d)),
                                     rel=1e-10)
    assert e["p"] == pytest.approx(0.5)                   # ranks 2, 1, 3: T = 5 of 6
    assert e["p_sign"] == 1.0                             # 2 of 3 positive: P(X<=1) = 1/2
    assert (e["better"], e["worse"], e["ties"]) == (2, 1, 0)
    assert e["higher_is_better"] is True

    one = ps.paired_comparison(runs + [_run("ntl-huber", 0, **{ACC: 0.6})])["ntl-huber"][ACC]
    assert (one["n"], one["ci95"]) == (1, None)           # one pair: no spread, no interval
    assert one["mean_diff"] == pytest.approx(0.1)

    empty = out["ntl-mse"][ACC]
    assert (empty["n"], empty["mean_diff"], empty["ci95"]) == (0, None, None)
    assert (empty["p"], empty["p_sign"]) == (1.0, 1.0)


def test_paired_comparison_variant_labels_and_explicit_baselines():
    runs = []
    for s in range(4):
        runs += [_run("ce", s, m=1.0 + s),
                 _run("ce lr=1e-3", s, m=2.0 + s),
                 _run("ntl-was λ=0.3 lr=1e-3", s, m=2.5 + s) | {"baseline": "ce lr=1e-3"}]
    out = ps.paired_comparison(runs, metrics=["m"])
    assert out["ntl-was λ=0.3 lr=1e-3"]["m"]["mean_diff"] == pytest.approx(0.5)
    assert out["ntl-was λ=0.3 lr=1e-3"]["m"]["baseline"] == "ce lr=1e-3"
    assert out["ce lr=1e-3"]["m"]["mean_diff"] == pytest.approx(1.0)    # against "ce"
    assert "ce" not in out

    with pytest.raises(ValueError, match="no runs"):
        ps.paired_comparison([_run("ce", 0, m=1.0), _run("x", 0, m=2.0) | {"baseline": "y"}])
    with pytest.raises(ValueError, match="seed 0"):
        ps.paired_comparison([_run("ce", 0, m=1.0), _run("ce", 0, m=2.0)])
    # a different default baseline
    out = ps.paired_comparison(runs, baseline="ce lr=1e-3", metrics=["m"])
    assert out["ce"]["m"]["mean_diff"] == pytest.approx(-1.0)


def test_better_worse_follow_metric_direction():
    ce = [_run("ce", s, **{ACC: 0.5, LMAE: 0.5, "test_interpolate/widgets": 0.5})
          for s in range(5)]
    shifts = [0.1, 0.2, -0.1, 0.0, 0.3]                 # 3 above, 1 below, 1 tie
    var = [_run("ntl", s, **{ACC: 0.5 + x, LMAE: 0.5 + x, "test_interpolate/widgets": 0.5 + x})
           for s, x in enumerate(shifts)]
    out = ps.paired_comparison(ce + var)["ntl"]
    acc, lmae, unknown = out[ACC], out[LMAE], out["test_interpolate/widgets"]
    assert (acc["better"], acc["worse"], acc["ties"], acc["higher_is_better"]) == (3, 1, 1, True)
    assert (lmae["better"], lmae["worse"], lmae["ties"]) == (1, 3, 1)
    assert lmae["higher_is_better"] is False
    assert (unknown["better"], unknown["worse"], unknown["ties"]) == (3, 1, 1)
    assert unknown["higher_is_better"] is None
    assert acc["p_sign"] == pytest.approx(stats.binomtest(3, 4).pvalue)
    assert acc["p"] == pytest.approx(stats.wilcoxon([0.1, 0.2, -0.1, 0.3], method="exact").pvalue)


@pytest.mark.parametrize("name, expected", [
    ("test_interpolate/number_accuracy", True), ("exact_match", True), ("x/r2", True),
    ("x/log_r2", True), ("x/pearson", True), ("x/spearman", True),
    ("x/mae", False), ("x/mse", False), ("test_extrapolate/log_mae", False),
    ("x/median_absolute_error", False), ("x/mape", False), ("x/fraction_unparseable", False),
    ("x/relative_error", False), ("x/num_examples", None), ("loss", None),
    ("test_interpolate/pearson_r", True), ("test_interpolate/parsed", True), ("test_interpolate/rmse", False),
])
def test_higher_is_better_names(name, expected):
    assert ps.higher_is_better(name) is expected


def test_no_nan_in_outputs():
    nan, inf = float("nan"), float("inf")
    runs = [_run("ce", 0, a=nan, b=1.0), _run("ce", 1, a=nan, b=2.0),
            _run("ntl", 0, a=0.3, b=inf), _run("ntl", 1, a=0.4, b=None)]
    paired = ps.paired_comparison(runs)
    summary = ps.describe(runs, thresholds={"a": 0.1, "b": 0.0})
    json.dumps(paired, allow_nan=False)
    json.dumps(summary, allow_nan=False)
    assert paired["ntl"]["a"]["mean_diff"] is None and paired["ntl"]["a"]["n"] == 0
    assert paired["ntl"]["b"]["ci95"] is None
    assert summary["ce"]["a"] == {"mean": None, "std": None, "n": 0, "values": [None, None],
                                  "seeds": [0, 1], "threshold": 0.1, "share_above": None}
    assert summary["ntl"]["b"]["values"] == [None, None]


# --- describe ----------------------------------------------------------------------------

def test_describe_orders_by_seed_and_counts_share_above():
    vals = {3: 0.76, 0: 0.45, 2: 0.77, 1: 0.44, 4: float("nan"), 5: 0.75}
    runs = [_run("ce", s, **{ACC: v, LMAE: 0.1 * s}) for s, v in vals.items()]
    runs.append(_run("ntl", 0, **{ACC: 0.5}))
    out = ps.describe(runs, thresholds={ACC: 0.6})
    e = out["ce"][ACC]
    finite = [0.45, 0.44, 0.77, 0.76, 0.75]
    assert e["seeds"] == [0, 1, 2, 3, 4, 5]
    assert e["values"] == [0.45, 0.44, 0.77, 0.76, None, 0.75]
    assert e["n"] == 5
    assert e["mean"] == pytest.approx(np.mean(finite))
    assert e["std"] == pytest.approx(np.std(finite, ddof=1))
    assert e["share_above"] == pytest.approx(3 / 5)
    assert e["threshold"] == 0.6
    assert "share_above" not in out["ce"][LMAE]
    assert out["ce"][LMAE]["values"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert out["ntl"][ACC]["std"] is None and out["ntl"][ACC]["mean"] == 0.5
    assert list(ps.describe(runs, metrics=[LMAE])["ce"]) == [LMAE]
    assert math.isclose(ps.describe(runs, metrics=[LMAE])["ce"][LMAE]["std"],
                        np.std([0.1 * s for s in range(6)], ddof=1))


def test_docstring_examples():
    import doctest

    result = doctest.testmod(ps)
    assert result.attempted >= 5 and result.failed == 0
