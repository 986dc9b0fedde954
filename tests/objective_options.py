"""The option sets the fused-head tests run through: every number loss with and without
reweigh (NTL's successors DEL and DIST² without: they have no largest value), squash,
cross-entropy alone, label smoothing with z-loss, the Gaussian-smoothed cross-entropy
(alone with NTL-WAS-CDF against a label of the same width, and with reweigh and z-loss),
a loss a user writes (`SQUARED_DISTANCE`); and every loss-normalising factor. Number
losses come as values and as spec strings, the two forms every entry point takes."""

import jax.numpy as jnp

from ntl_jax import losses


def _squared_distance(columns, target, number_tokens):  # a function of each number token
    return jnp.square(columns.value - target.value[..., None])


# A loss a user writes in a few lines, as docs/guides/losses.md shows: E_p[(v - y)^2],
# the expected squared distance, counted at number targets. It must go everywhere a
# shipped loss goes.
SQUARED_DISTANCE = losses.NumberLoss(
    "squared_distance", losses.NumberReads(means=(_squared_distance,)),
    lambda stats, target, number_tokens: (stats.means[0], target.is_number))

OPTIONS = {
    "was": dict(number_loss="was"),
    "was-reweigh": dict(number_loss=losses.was(reweigh=True)),
    "was-squash": dict(number_loss=losses.was(squash_factor=3.0)),
    "was-squash-reweigh": dict(number_loss="was(squash_factor=3.0, reweigh=true)"),
    "mse": dict(number_loss="mse"),
    "mae-reweigh": dict(number_loss=losses.mae(reweigh=True)),
    "huber": dict(number_loss=losses.huber()),
    "number_level": dict(number_loss="number_level"),
    "number_level_float-reweigh": dict(number_loss=losses.number_level(float_level=True, reweigh=True)),
    "ce": dict(number_loss=None),
    "smoothing-z": dict(number_loss="was", label_smoothing=0.1, z_loss=1e-3, ntl_weight=1.0),
    "was_cdf-gce": dict(number_loss=losses.was_cdf(sigma=1.0), gce_sigma=1.0),
    "mse-gce-reweigh-z": dict(number_loss=losses.mse(reweigh=True), gce_sigma=0.5, z_loss=1e-3),
    "del": dict(number_loss="del"),
    "dist2-smoothing": dict(number_loss="dist2", label_smoothing=0.1),
    "squared_distance": dict(number_loss=SQUARED_DISTANCE, z_loss=1e-3),
    "ntil": dict(number_loss="ntil"),
}
FACTORS = [None, 37.0, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]


def registered_loss():
    """The loss the package in tests/fixtures/own_loss_package ships ("squared_gap",
    E_p[(v - y)^2]), registered in this process as that package's users do."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent / "fixtures" / "own_loss_package" / "ntl_own_losses.py"
    if "squared_gap" not in losses.LOSSES:
        spec = importlib.util.spec_from_file_location("ntl_own_losses", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        losses.register(module.squared_gap)
    return losses.parse("squared_gap")


def as_options(**options):
    """The objective's `Options` record of a case's keyword arguments (the cross-entropy's
    fields, `label_smoothing=` and the like, make its one `CrossEntropy` value)."""
    from ntl_jax._core.options import CROSS_ENTROPY_KEYWORDS, CrossEntropy, Options

    fields = {name: options.pop(name) for name in CROSS_ENTROPY_KEYWORDS if name in options}
    return Options(**options, cross_entropy=CrossEntropy(**fields))
