"""The number losses, each one value, as optax's optimizers are.

A constructor takes that loss's own parameters, checks them, and returns a
`NumberLoss`; every entry point takes one as `number_loss=` (or a spec string that
`parse` reads, `"smmd(sigma=2, mode=smooth)"`)::

    loss, parts = ntl_jax.cross_entropy_and_ntl(
        logits, targets, number_tokens, number_loss=ntl_jax.losses.was(squash_factor=2.0))

A loss of your own is a `NumberLoss` built from a function of the number statistics
(docs/guides/losses.md), and goes everywhere a shipped one does.
"""

from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, expected_value, of_logits
from ntl_jax._core.targets import NumberTarget
from ntl_jax._core.variants import (
    LOSSES,
    NAMES,
    NumberLoss,
    digit_entropy,
    dist2,
    expected_value_loss,
    huber,
    mae,
    mse,
    number_level,
    parse,
    resolve,
    smmd,
    was,
    was_cdf,
)

__all__ = [
    "LOSSES",
    "NAMES",
    "Columns",
    "NumberLoss",
    "NumberReads",
    "NumberStats",
    "NumberTarget",
    "digit_entropy",
    "dist2",
    "expected_value",
    "expected_value_loss",
    "huber",
    "mae",
    "mse",
    "number_level",
    "of_logits",
    "parse",
    "resolve",
    "smmd",
    "was",
    "was_cdf",
]
