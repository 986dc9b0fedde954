"""Paired statistics for `ntl-jax compare` runs (numpy and the standard library only).

Runs of the same seed share initialisation and data order, so a loss is compared with
the baseline (CE) seed by seed: the unit of analysis is the paired difference
``d = metric(variant, seed) - metric(baseline, seed)``. With the handful of seeds a
comparison affords, everything here holds for small n rather than asymptotically:

* `t_interval`: Student t interval of the mean difference (`t_quantile` written out, since
  scipy is not a dependency of the trainer);
* `bootstrap_ci`: percentile bootstrap interval of the mean difference (too narrow with
  few seeds: not used for the tables);
* `sign_test_p`: exact two-sided binomial sign test;
* `wilcoxon_p`: exact two-sided Wilcoxon signed-rank test (also with tied ranks);
* `min_attainable_p`: the smallest p those exact tests can give with n pairs;
* `holm`: Holm's step-down adjustment of several p-values;
* `paired_comparison`: interval and tests per variant and metric, from a list of runs;
* `describe`: mean, std and per-seed values per loss and metric, and, for bimodal
  outcomes, the share of seeds above a threshold.

A run is a dict ``{"loss": label, "seed": int, "metrics": {name: float | None}}``
(other keys are ignored, except an optional ``"baseline"``: the label of the run it
is paired with). Every output is strict-JSON safe: non-finite numbers come out as None.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np

# |d| at or below this counts as a tie (no difference) in the sign and signed-rank tests
# and in the better/worse/ties counts.
TIE_ATOL = 1e-12

# Metric names (the part after the last "/") are matched by suffix, longest first, so
# "log_mae" is "lower" and "log_r2" is "higher". Names matching neither list get
# `higher_is_better = None`; their better/worse counts then mean above/below zero.
HIGHER_IS_BETTER = ("accuracy", "exact_match", "log_r2", "r2", "pearson", "pearson_r", "spearman", "parsed")
LOWER_IS_BETTER = ("median_absolute_error", "fraction_unparseable", "relative_error",
                   "log_mae", "mae", "mse", "rmse", "mape")


def _finite_array(diffs: Iterable[float]) -> np.ndarray:
    d = np.asarray(list(diffs) if not isinstance(diffs, np.ndarray) else diffs, dtype=float)
    d = d.reshape(-1)
    if not np.all(np.isfinite(d)):
        raise ValueError("differences must be finite numbers")
    return d


def _nonzero(d: np.ndarray) -> np.ndarray:
    return d[np.abs(d) > TIE_ATOL]


def bootstrap_ci(diffs: Sequence[float], *, confidence: float = 0.95, n_resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `diffs`.

    Exactly: ``rng = np.random.default_rng(seed)``; ``idx = rng.integers(0, n,
    size=(n_resamples, n))``; the means ``d[idx].mean(axis=1)`` are summarised by
    ``np.percentile(means, [50 (1 - confidence), 50 (1 + confidence)])``. Deterministic
    for a seed. One difference, or all equal, gives ``(d, d)``; none raises ValueError.

    >>> bootstrap_ci([0.2])
    (0.2, 0.2)
    >>> lo, hi = bootstrap_ci([0.1, 0.2, 0.3, 0.4, 0.5]); bool(lo < 0.3 < hi)
    True
    """
    d = _finite_array(diffs)
    if d.size == 0:
        raise ValueError("bootstrap_ci needs at least one difference")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_resamples, d.size))
    means = d[idx].mean(axis=1)
    alpha = 1.0 - confidence
    lo, hi = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def t_quantile(q: float, df: int) -> float:
    """The `q`-quantile of Student's t with `df` (an integer >= 1) degrees of freedom.

    P(|T| <= t) for integer df is a finite sum in theta = arctan(t / sqrt(df))
    (Abramowitz & Stegun 26.7.3-4), increasing in theta on [0, pi/2); it is inverted by
    bisection on theta to the last bit. Equals ``scipy.stats.t.ppf(q, df)`` to ~1e-12.

    >>> round(t_quantile(0.975, 4), 6)
    2.776445
    """
    if isinstance(df, bool) or int(df) != df or df < 1:
        raise ValueError(f"df: expected an integer >= 1, got {df!r}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q: expected a number in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    target, df = 2.0 * q - 1.0, int(df)
    lo, hi = 0.0, math.pi / 2
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _t_central_mass(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan(0.5 * (lo + hi))


def _t_central_mass(theta: float, df: int) -> float:
    """P(|T| <= sqrt(df) tan(theta)) for Student's t with integer `df` (A&S 26.7.3-4)."""
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term = total = math.cos(theta)
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + s * total) if df > 1 else 2.0 / math.pi * theta
    term = total = 1.0  # sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_interval(diffs: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """Student t interval of the mean of `diffs`: ``mean -/+ t_q(n - 1) * sd / sqrt(n)``,
    ``q = (1 + confidence) / 2``, sd with ddof=1.

    The paired differences of a handful of seeds are what it is for: a bootstrap of 5-10
    values resamples too few distinct means and is too narrow. All equal gives ``(d, d)``;
    fewer than two differences raise ValueError (no spread to scale by).

    >>> [round(x, 6) for x in t_interval([0.1, 0.2, 0.3])]
    [-0.048414, 0.448414]
    """
    d = _finite_array(diffs)
    if d.size < 2:
        raise ValueError(f"t_interval: expected at least two differences, got {d.size}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    mean = float(d.mean())
    half = t_quantile(0.5 * (1.0 + confidence), d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size)
    return mean - half, mean + half


def min_attainable_p(n_untied: int) -> float:
    """The smallest two-sided p-value the exact sign and signed-rank tests can give with
    `n_untied` non-zero differences: 2 / 2^n (every sign the same). Below 6 pairs it is
    at least 1/16 = 0.0625, so those tests cannot reach p < 0.05 whatever the data.

    >>> min_attainable_p(5), min_attainable_p(6)
    (0.0625, 0.03125)
    """
    if n_untied < 0:
        raise ValueError(f"n_untied: expected a count >= 0, got {n_untied}")
    return 1.0 if n_untied == 0 else min(1.0, 2.0 ** (1 - n_untied))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (None stays None and is not
    counted among the m tests).

    With the m p-values sorted, p_(1) <= ... <= p_(m), the adjusted value of p_(i) is
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``; rejecting where it is below alpha keeps
    the family-wise error rate at alpha for any dependence between the tests.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    ps = [None if p is None else float(p) for p in pvalues]
    for p in ps:
        if p is not None and not 0.0 <= p <= 1.0:
            raise ValueError(f"holm: expected p-values in [0, 1], got {p}")
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    m, running = len(order), 0.0
    out: list[float | None] = [None] * len(ps)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def sign_test_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign test: P(a Binomial(n, 1/2) count at least as extreme).

    Ties (``|d| <= TIE_ATOL``) are dropped; with no non-zero difference the p-value is
    1.0. Equals ``scipy.stats.binomtest(k, n, 0.5).pvalue`` for k positive differences.

    >>> sign_test_p([1, 2, 3, 4, 5])
    0.0625
    """
    d = _nonzero(_finite_array(diffs))
    n = int(d.size)
    if n == 0:
        return 1.0
    k = int(np.sum(d > 0))
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2 ** n)))


def _doubled_ranks(a: np.ndarray) -> list[int]:
    """Twice the average ranks (1-based) of `a` (all > 0), as integers.

    Values within a relative 1e-9 of their sorted neighbour are tied, so differences
    that are equal but for float rounding (``0.8 - 0.7`` vs ``0.3 - 0.2``) share a rank.
    """
    order = np.argsort(a, kind="stable")
    s = a[order]
    ranks = [0] * a.size
    i = 0
    while i < s.size:
        j = i
        while j + 1 < s.size and math.isclose(s[j + 1], s[j], rel_tol=1e-9, abs_tol=TIE_ATOL):
            j += 1
        # positions i..j (0-based) share the average rank ((i + 1) + (j + 1)) / 2
        for k in range(i, j + 1):
            ranks[order[k]] = i + j + 2
        i = j + 1
    return ranks


def wilcoxon_p(diffs: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p-value.

    Zeros (``|d| <= TIE_ATOL``) are dropped before ranking (scipy's default
    ``zero_method="wilcox"``); tied ``|d|`` get average ranks. Under the null each sign
    is + or - with probability 1/2, so the distribution of the statistic ``T`` (the
    rank sum of the positive differences) is counted exactly by dynamic programming
    over the 2^n sign assignments, with doubled (integer) ranks so that average ranks
    stay exact. ``p = min(1, 2 min(P(T <= t), P(T >= t)))``, which is
    ``scipy.stats.wilcoxon(d, method="exact").pvalue`` when there are no ties (scipy
    does not offer the exact test with ties). No non-zero difference gives 1.0.

    >>> wilcoxon_p([1, 2, 3, 4, 5])
    0.0625
    """
    d = _nonzero(_finite_array(diffs))
    n = int(d.size)
    if n == 0:
        return 1.0
    ranks = _doubled_ranks(np.abs(d))
    total = sum(ranks)
    # counts[s]: number of sign assignments whose positive doubled ranks sum to s
    counts = [0] * (total + 1)
    counts[0] = 1
    reach = 0
    for r in ranks:
        for s in range(reach, -1, -1):
            if counts[s]:
                counts[s + r] += counts[s]
        reach += r
    t = sum(r for r, x in zip(ranks, d) if x > 0)
    below = sum(counts[: t + 1])
    above = sum(counts[t:])
    return float(min(Fraction(1), Fraction(2 * min(below, above), 2 ** n)))


def higher_is_better(metric: str) -> bool | None:
    """True / False from the metric's name (suffix after the last "/"), None if unknown.

    >>> higher_is_better("test_interpolate/number_accuracy"), higher_is_better("test/log_mae")
    (True, False)
    >>> higher_is_better("test/num_examples") is None
    True
    """
    name = metric.rsplit("/", 1)[-1]
    # longest suffix first, across both lists, so "log_mae" is not read as "mae" etc.
    for suffix, value in sorted([(s, True) for s in HIGHER_IS_BETTER]
                                + [(s, False) for s in LOWER_IS_BETTER],
                                key=lambda x: -len(x[0])):
        if name.endswith(suffix):
            return value
    return None


def _value(x) -> float | None:
    """A finite float, or None (missing, None, NaN, inf, not a number)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _clean(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _index(runs: Sequence[dict]) -> dict[str, dict[int, dict]]:
    """``{label: {seed: run}}`` in first-seen label order; duplicate (label, seed) raises."""
    by_label: dict[str, dict[int, dict]] = {}
    for run in runs:
        label, seed = str(run["loss"]), int(run["seed"])
        seeds = by_label.setdefault(label, {})
        if seed in seeds:
            raise ValueError(f"two runs of {label!r} with seed {seed}")
        seeds[seed] = run
    return by_label


def _metric_names(groups: Iterable[dict[int, dict]]) -> list[str]:
    names: dict[str, None] = {}
    for group in groups:
        for seed in sorted(group):
            names.update(dict.fromkeys(group[seed].get("metrics", {})))
    return list(names)


def _baseline_of(label: str, seeds: dict[int, dict], default: str) -> tuple[str, bool]:
    """The label `label` is paired with, and whether a run named it explicitly."""
    named = {str(r["baseline"]) for r in seeds.values() if r.get("baseline") is not None}
    if len(named) > 1:
        raise ValueError(f"runs of {label!r} name different baselines: {sorted(named)}")
    return (named.pop(), True) if named else (default, False)


def paired_comparison(runs: Sequence[dict], *, baseline: str = "ce",
                      metrics: Sequence[str] | None = None,
                      threshold=None) -> dict[str, dict[str, dict]]:
    """Every variant against its baseline, paired by seed, per metric.

    A run's label is its ``"loss"``; it is paired with the runs labelled by its
    ``"baseline"`` key (all runs of a label must agree), else by `baseline`. Labels
    paired with themselves (the baseline) are skipped, and so is a label whose default
    baseline has no runs; a baseline named explicitly but absent raises ValueError.
    For each metric (`metrics`, or every metric name seen in the variant's or its
    baseline's runs) the pairs are the seeds present in both with finite values, and
    ``d = variant - baseline``. Returns::

        {label: {metric: {"baseline": str, "n": int, "mean_diff": float | None,
                          "ci95": [lo, hi] | None, "p": float, "p_sign": float,
                          "better": int, "worse": int, "ties": int,
                          "higher_is_better": bool | None}}}

    ``p`` is `wilcoxon_p`, ``p_sign`` `sign_test_p`, ``ci95`` `t_interval` at 95 %
    (None when n < 2; ``mean_diff`` None when n = 0). ``better`` counts seeds where the variant
    is better (d > 0 if higher is better, d < 0 if lower is); for a metric of unknown
    direction (``higher_is_better`` None) ``better`` / ``worse`` count d > 0 / d < 0.
    ``ties`` counts ``|d| <= TIE_ATOL``. `threshold` is accepted for symmetry with
    `describe` and is unused (thresholds describe one loss, not a difference).
    """
    del threshold
    by_label = _index(runs)
    out: dict[str, dict[str, dict]] = {}
    for label, seeds in by_label.items():
        base_label, explicit = _baseline_of(label, seeds, baseline)
        if base_label == label:
            continue
        if base_label not in by_label:
            if explicit:
                raise ValueError(f"runs of {label!r} name baseline {base_label!r}, "
                                 "which has no runs")
            continue
        base = by_label[base_label]
        names = list(metrics) if metrics is not None else _metric_names([seeds, base])
        out[label] = {}
        for metric in names:
            diffs = []
            for seed in sorted(set(seeds) & set(base)):
                v = _value(seeds[seed].get("metrics", {}).get(metric))
                b = _value(base[seed].get("metrics", {}).get(metric))
                if v is not None and b is not None:
                    diffs.append(v - b)
            d = np.asarray(diffs, dtype=float)
            direction = higher_is_better(metric)
            above, below = int(np.sum(d > TIE_ATOL)), int(np.sum(d < -TIE_ATOL))
            better, worse = (below, above) if direction is False else (above, below)
            ci = [_clean(x) for x in t_interval(d)] if d.size >= 2 else None
            out[label][metric] = {
                "baseline": base_label,
                "n": int(d.size),
                "mean_diff": _clean(float(d.mean())) if d.size else None,
                "ci95": ci,
                "p": wilcoxon_p(d),
                "p_sign": sign_test_p(d),
                "better": better,
                "worse": worse,
                "ties": int(d.size) - above - below,
                "higher_is_better": direction,
            }
    return out


def describe(runs: Sequence[dict], *, metrics: Sequence[str] | None = None,
             thresholds: dict[str, float] | None = None) -> dict[str, dict[str, dict]]:
    """Per label and metric: ``{"mean", "std", "n", "values", "seeds"}``.

    ``seeds`` lists every seed of the label in increasing order and ``values`` the
    metric per seed, aligned with it (None where missing or non-finite); ``n`` counts
    the finite values, over which ``mean`` and ``std`` (ddof=1; None for n < 2) are
    taken. For a metric in `thresholds` the entry also has ``"threshold": t`` and
    ``"share_above"``: the fraction of the n finite values that are > t (None if
    n = 0) -- for bimodal outcomes, the share of seeds that land in the high mode.
    """
    thresholds = dict(thresholds or {})
    by_label = _index(runs)
    out: dict[str, dict[str, dict]] = {}
    for label, seeds in by_label.items():
        names = list(metrics) if metrics is not None else _metric_names([seeds])
        out[label] = {}
        order = sorted(seeds)
        for metric in names:
            values = [_value(seeds[s].get("metrics", {}).get(metric)) for s in order]
            finite = np.asarray([v for v in values if v is not None], dtype=float)
            n = int(finite.size)
            entry = {
                "mean": _clean(float(finite.mean())) if n else None,
                "std": _clean(float(finite.std(ddof=1))) if n >= 2 else None,
                "n": n,
                "values": values,
                "seeds": list(order),
            }
            if metric in thresholds:
                t = float(thresholds[metric])
                entry["threshold"] = t
                entry["share_above"] = float(np.mean(finite > t)) if n else None
            out[label][metric] = entry
    return out
