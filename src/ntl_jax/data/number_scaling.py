"""The log scaling of number values that the paper's authors give xVal and the Regression
Transformer (tum-ai/number-token-loss, `V_MAX` in `t5_xval.py` and `t5_rt.py`).

A value x becomes `sign(x) * log10(1 + |x|) / (log10(V_MAX) / 10)` with V_MAX = 3e9, so
|x| <= V_MAX lands in [-10, 10]. xVal multiplies its `[NUM]` embedding by the scaled
value (`ntl_jax.train.xval`); RT adds fixed encodings built from scaled values to the
embeddings of its number tokens (`ntl_jax.data.rt_vocabulary.RtVocabulary.float_encodings`).
"""

from __future__ import annotations

import math

import numpy as np

V_MAX = 3e9
SCALE_DIVISOR = math.log10(V_MAX) / 10  # log10(3e9) / 10 = 0.9477...


def scale_values(values) -> np.ndarray:
    """`sign(x) * log10(1 + |x|) / (log10(V_MAX) / 10)`, float64.

    >>> scale_values([0.0, 9.0, -999.0, 3e9]).round(4).tolist()
    [0.0, 1.0552, -3.1655, 10.0]
    """
    x = np.asarray(values, np.float64)
    return np.sign(x) * np.log10(1.0 + np.abs(x)) / SCALE_DIVISOR


def unscale_values(scaled) -> np.ndarray:
    """The inverse of `scale_values` (inf where `10**(|s| * ...)` overflows), float64."""
    s = np.asarray(scaled, np.float64)
    with np.errstate(over="ignore"):
        return np.sign(s) * (np.power(10.0, np.abs(s) * SCALE_DIVISOR) - 1.0)
