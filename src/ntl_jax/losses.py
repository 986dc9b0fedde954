"""The number losses, each one value, as optax's optimizers are.

A constructor takes that loss's own parameters, checks them, and returns a
`NumberLoss`; every entry point takes one as `number_loss=` (or a spec string that
`parse` reads, `"smmd(sigma=2, mode=smooth)"`)::

    loss, parts = ntl_jax.cross_entropy_and_ntl(
        logits, targets, number_tokens, number_loss=ntl_jax.losses.was(squash_factor=2.0))

A loss of your own is one line (`expectation("squared", lambda v, y: (v - y) ** 2)`,
`of_expected_value(...)`) or a full `NumberLoss` (docs/guides/losses.md); once
`register`ed it goes everywhere a shipped one does, spec strings included.
"""

from ntl_jax._core.number_losses.ntl import distance_table, expectation, expected_value_loss, of_expected_value
from ntl_jax._core.number_losses.number_loss import (
    COMBINES,
    DEFAULT,
    DEFAULT_WEIGHT,
    LOSSES,
    MEAN_OVER,
    MEAN_OVERS,
    NumberLoss,
    with_mean_over,
)
from ntl_jax._core.number_losses.registry import (  # the shipped losses' constructors, as the registry has them
    NAMES,
    digit_entropy,
    dist2,
    huber,
    mae,
    mse,
    ntil,
    number_level,
    parse,
    register,
    resolve,
    smmd,
    was,
    was_cdf,
)
from ntl_jax._core.number_stats import Columns, NumberReads, NumberStats, expected_value, of_logits
from ntl_jax._core.targets import NumberTarget

__all__ = [
    "COMBINES",
    "DEFAULT",
    "DEFAULT_WEIGHT",
    "LOSSES",
    "MEAN_OVER",
    "MEAN_OVERS",
    "NAMES",
    "Columns",
    "NumberLoss",
    "NumberReads",
    "NumberStats",
    "NumberTarget",
    "digit_entropy",
    "distance_table",
    "dist2",
    "expectation",
    "expected_value",
    "expected_value_loss",
    "huber",
    "mae",
    "mse",
    "ntil",
    "number_level",
    "of_expected_value",
    "of_logits",
    "parse",
    "register",
    "resolve",
    "smmd",
    "was",
    "was_cdf",
    "with_mean_over",
]
