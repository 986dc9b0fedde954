"""Number metrics on decoded strings, as in the paper's evaluation code.

Definitions follow tum-ai/number-token-loss (`src/ntl/evaluation.py`, `CustomMetrics`):

* The number of a string is its *last* match of `[+-]?\\s*\\d+(\\.\\d+)?` with spaces
  removed; a prediction's number is clipped to [-1e10, 1e10]. A prediction without a
  number is *unparseable*.
* `number_accuracy`: fraction of all examples whose predicted number `np.isclose`s the
  target's (unparseable counts as wrong).
* `mae`, `mse`, `median_absolute_error`, `r2`, `log_mae`, `log_r2`, `pearson`,
  `spearman`: over the examples with a parseable prediction. R² is
  `1 - sum((p - t)^2) / sum((t - mean(t))^2)` (NaN, or -inf, for constant targets);
  the log variants apply
  `sign(x) * log10(|x| + 1)` to both first. Pearson and Spearman are 0 with fewer than
  two pairs (as the paper code) and NaN when either side is constant.
* `fraction_unparseable`: unparseable predictions / examples; `exact_match`: the whole
  stripped strings are equal.

Examples whose target has no number (non-numeric modules) are left out of the number
metrics; `num_examples` counts those that remain. Metrics with no pairs to average are
NaN. Use the functions as seqio `metric_fns` (arguments `targets, predictions`).
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

__all__ = ["CLIP", "PREDICTION_DECIMALS", "exact_match", "format_prediction", "fraction_unparseable", "log_mae",
           "log_r2", "mae", "median_absolute_error", "mse", "number_accuracy", "number_metrics", "parse_number",
           "pearson", "r2", "regression_metrics", "signed_log10", "spearman"]

_NUMBER = re.compile(r"\s*([+-]?\s*(\d+)(\.\d+)?)")
CLIP = 1e10
PREDICTION_DECIMALS = 2  # a predicted value written as text (`format_prediction`)
"""Parsed predictions are clipped to [-CLIP, CLIP] before the error metrics."""


def parse_number(text) -> float:
    """The last number in `text` (NaN if none), the paper's parser without clipping.

    Examples:
      >>> parse_number("x = -1747.09"), parse_number("no digits")
      (-1747.09, nan)
    """
    if text is None:
        return math.nan
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        if isinstance(text, (int, float, np.integer, np.floating)):
            return float(text)
        raise TypeError(f"expected a string, got {type(text).__name__}")
    found = _NUMBER.findall(text)
    if not found:
        return math.nan
    try:
        return float(found[-1][0].replace(" ", ""))
    except ValueError:  # pragma: no cover - the pattern only matches floats
        return math.nan


def signed_log10(x):
    """`sign(x) * log10(|x| + 1)`, elementwise."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.log10(np.abs(x) + 1.0)


def _pairs(targets: Sequence, predictions: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """Parsed `(targets, predictions)` as float64 arrays, examples without a target
    number dropped, predictions clipped; NaN marks an unparseable prediction."""
    if len(targets) != len(predictions):
        raise ValueError(
            f"expected as many predictions as targets, got {len(predictions)} predictions "
            f"for {len(targets)} targets")
    t = np.array([parse_number(x) for x in targets], dtype=np.float64)
    p = np.array([parse_number(x) for x in predictions], dtype=np.float64)
    keep = ~np.isnan(t)
    p = np.clip(p[keep], -CLIP, CLIP)
    return t[keep], p


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else math.nan


def _r2(t: np.ndarray, p: np.ndarray) -> float:
    if t.size == 0:
        return math.nan
    ss_tot = float(np.sum((t - np.mean(t)) ** 2))
    ss_res = float(np.sum((p - t) ** 2))
    if ss_tot == 0.0:  # constant targets: undefined, as 0/0 and x/0 in the paper code
        return math.nan if ss_res == 0.0 else -math.inf
    return 1.0 - ss_res / ss_tot


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 2:
        return 0.0
    a = a - a.mean()
    b = b - b.mean()
    denom = math.sqrt(float(np.sum(a * a)) * float(np.sum(b * b)))
    return float(np.sum(a * b)) / denom if denom > 0 else math.nan


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(x.size, dtype=np.float64)
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _metric(key: str):
    def fn(targets, predictions) -> float:
        return number_metrics(targets, predictions)[key]

    fn.__name__ = key
    fn.__doc__ = f"`number_metrics(targets, predictions)[{key!r}]` (see the module docstring); a float."
    return fn


# One function per key of `number_metrics`, each `fn(targets, predictions) -> float`; the
# string after each is its entry in the API reference.
number_accuracy = _metric("number_accuracy")
"""Fraction of examples whose number is right: `number_accuracy(targets, predictions) -> float`."""
mae = _metric("mae")
"""Mean absolute error over parseable predictions: `mae(targets, predictions) -> float`."""
mse = _metric("mse")
"""Mean squared error over parseable predictions: `mse(targets, predictions) -> float`."""
r2 = _metric("r2")
"""Coefficient of determination over parseable predictions: `r2(targets, predictions) -> float`."""
median_absolute_error = _metric("median_absolute_error")
"""Median absolute error: `median_absolute_error(targets, predictions) -> float`."""
log_mae = _metric("log_mae")
"""MAE on sign(x)*log10(|x|+1): `log_mae(targets, predictions) -> float`."""
log_r2 = _metric("log_r2")
"""R^2 on sign(x)*log10(|x|+1): `log_r2(targets, predictions) -> float`."""
pearson = _metric("pearson")
"""Pearson correlation of prediction and target: `pearson(targets, predictions) -> float`."""
spearman = _metric("spearman")
"""Spearman rank correlation of prediction and target: `spearman(targets, predictions) -> float`."""
fraction_unparseable = _metric("fraction_unparseable")
"""Fraction of predictions without a number: `fraction_unparseable(targets, predictions) -> float`."""


def exact_match(targets, predictions) -> dict[str, float]:
    """seqio metric fn: `{"exact_match": fraction of identical stripped strings}`."""
    if len(targets) != len(predictions):
        raise ValueError(
            f"expected as many predictions as targets, got {len(predictions)} predictions "
            f"for {len(targets)} targets")
    if not targets:
        return {"exact_match": math.nan}

    def norm(x):
        if isinstance(x, bytes):
            x = x.decode("utf-8", errors="replace")
        return "" if x is None else str(x).strip()

    return {"exact_match": float(np.mean([norm(a) == norm(b) for a, b in zip(targets, predictions)]))}


def regression_metrics(targets, predictions) -> dict[str, float]:
    """seqio metric fn for a number predicted from text: `rmse` and `pearson_r` of the
    predicted numbers (`parse_number`: the last number of the string) against the
    targets', and `parsed`, the share of predictions with a finite number.

    A prediction without one is left out of `rmse` and `pearson_r`, which are NaN when
    nothing parses; `pearson_r` is also NaN with fewer than two parsed predictions or
    when either side is constant (a model that answers one number to everything has no
    correlation). Every target must hold a number.

    Examples:
      >>> m = regression_metrics(["100", "200", "300"], ["110", "190", "no idea"])
      >>> round(m["rmse"], 6), round(m["pearson_r"], 6), round(m["parsed"], 4)
      (10.0, 1.0, 0.6667)
    """
    if len(targets) != len(predictions):
        raise ValueError(
            f"expected as many predictions as targets, got {len(predictions)} predictions "
            f"for {len(targets)} targets")
    if not len(targets):
        return {"parsed": math.nan, "rmse": math.nan, "pearson_r": math.nan}
    t = np.array([parse_number(x) for x in targets], np.float64)
    if not np.isfinite(t).all():
        bad = targets[int(np.flatnonzero(~np.isfinite(t))[0])]
        raise ValueError(f"expected a number as every target, got {bad!r}")
    p = np.array([parse_number(x) for x in predictions], np.float64)
    ok = np.isfinite(p)
    out = {"parsed": float(ok.mean()), "rmse": math.nan, "pearson_r": math.nan}
    if ok.any():
        out["rmse"] = float(np.sqrt(np.mean((p[ok] - t[ok]) ** 2)))
    if ok.sum() >= 2:
        dp, dt = p[ok] - p[ok].mean(), t[ok] - t[ok].mean()
        denom = math.sqrt(float(np.sum(dp * dp)) * float(np.sum(dt * dt)))
        if denom > 0:
            out["pearson_r"] = float(np.clip(np.sum(dp * dt) / denom, -1.0, 1.0))
    return out


def number_metrics(targets, predictions) -> dict[str, float]:
    """seqio metric fn: every number metric of the paper in one dict.

    Examples:
      >>> m = number_metrics(["12", "-3", "7"], ["12", "-1", ""])
      >>> m["number_accuracy"], m["mae"], m["fraction_unparseable"]
      (0.3333333333333333, 1.0, 0.3333333333333333)
    """
    t, p = _pairs(targets, predictions)
    ok = ~np.isnan(p)
    tv, pv = t[ok], p[ok]
    n = t.size
    spear = 0.0 if tv.size < 2 else _pearson(_ranks(pv), _ranks(tv))
    return {
        "number_accuracy": float(np.sum(np.isclose(pv, tv))) / n if n else math.nan,
        "mae": _mean(np.abs(pv - tv)),
        "mse": _mean((pv - tv) ** 2),
        "r2": _r2(tv, pv),
        "median_absolute_error": float(np.median(np.abs(pv - tv))) if tv.size else math.nan,
        "log_mae": _mean(np.abs(signed_log10(pv) - signed_log10(tv))),
        "log_r2": _r2(signed_log10(tv), signed_log10(pv)),
        "pearson": _pearson(pv, tv),
        "spearman": spear,
        "fraction_unparseable": float(np.mean(~ok)) if n else math.nan,
        "num_examples": float(n),
    }


def format_prediction(value: float) -> str:
    """A prediction as the text the number metrics read: 2 decimals, trailing zeros
    dropped, never an exponent; "nan" / "inf" (no number) when not finite.

    >>> format_prediction(151.374), format_prediction(-3.0), format_prediction(2e12)
    ('151.37', '-3', '2000000000000')
    """
    if not math.isfinite(value):
        return str(value)
    return np.format_float_positional(round(float(value), PREDICTION_DECIMALS),
                                      precision=PREDICTION_DECIMALS, trim="-")
