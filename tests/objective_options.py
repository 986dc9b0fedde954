"""The option sets the fused-head tests run through: every NTL variant with and without
reweigh (NTL's successors DEL and DIST² without: they have no largest value), squash,
cross-entropy alone, label smoothing with z-loss, the Gaussian-smoothed cross-entropy
(alone with NTL-WAS-CDF, and with reweigh and z-loss); and every loss-normalising factor."""

OPTIONS = {
    "was": dict(ntl_kind="was"),
    "was-reweigh": dict(ntl_kind="was", reweigh=True),
    "was-squash": dict(ntl_kind="was", squash_factor=3.0),
    "was-squash-reweigh": dict(ntl_kind="was", squash_factor=3.0, reweigh=True),
    "mse": dict(ntl_kind="mse"),
    "mae-reweigh": dict(ntl_kind="mae", reweigh=True),
    "huber": dict(ntl_kind="huber"),
    "number_level": dict(ntl_kind="number_level"),
    "number_level_float-reweigh": dict(ntl_kind="number_level_float", reweigh=True),
    "ce": dict(ntl_kind="none"),
    "smoothing-z": dict(ntl_kind="was", label_smoothing=0.1, z_loss=1e-3, ntl_weight=1.0),
    "was_cdf-gce": dict(ntl_kind="was_cdf", gce_sigma=1.0),
    "mse-gce-reweigh-z": dict(ntl_kind="mse", gce_sigma=0.5, reweigh=True, z_loss=1e-3),
    "del": dict(ntl_kind="del"),
    "dist2-smoothing": dict(ntl_kind="dist2", label_smoothing=0.1),
}
FACTORS = [None, 37.0, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]
