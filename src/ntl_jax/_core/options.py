"""The objective's options, in one frozen record checked once when it is made.

`cross_entropy_and_ntl`, `fused_cross_entropy_and_ntl` and the T5X models take these as
keyword arguments and build one `Options`; everything below them reads the record. The
number loss is one value (`NumberLoss`) that holds and checks its own
parameters; the rest are the cross-entropy's and the weight between the two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ntl_jax._core import checks
from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, weight_of


@dataclasses.dataclass(frozen=True)
class Options:
    """The objective's options; making one raises `ValueError`/`TypeError` for a bad one.

    - `number_loss`: a `NumberLoss`, a spec string (`"was"`,
      `"smmd(sigma=2)"`), or None / `"none"` (cross-entropy alone, no number loss
      computed); held resolved;
    - `ntl_weight`: lambda, the number loss's weight (>= 0); None: the loss's own
      (`NumberLoss.default_weight`), held resolved;
    - `label_smoothing`, `z_loss`: T5X's cross-entropy options;
    - `gce_sigma`: the cross-entropy's Gaussian label's width (0: none), exclusive with
      `label_smoothing`. It changes the cross-entropy only.
    """

    number_loss: Any = DEFAULT
    ntl_weight: float | None = None
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    gce_sigma: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "number_loss", registry.resolve(self.number_loss))
        object.__setattr__(self, "ntl_weight", weight_of(self.number_loss, self.ntl_weight))
        checks.check_real("ntl_weight", self.ntl_weight, low=0.0)
        checks.check_real("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        checks.check_real("z_loss", self.z_loss, low=0.0)
        if checks.check_gce_sigma(self.gce_sigma) > 0 and self.label_smoothing > 0:
            raise ValueError(
                "expected at most one of gce_sigma and label_smoothing (two smoothings of one label), "
                f"got gce_sigma={self.gce_sigma} and label_smoothing={self.label_smoothing}"
            )

    @property
    def smoothed(self) -> bool:
        """Whether the cross-entropy's label is Gaussian-smoothed (`gce_sigma` > 0)."""
        return self.gce_sigma > 0
