"""The options of the objective, in one frozen record checked once when it is made.

`cross_entropy_and_ntl`, `fused_cross_entropy_and_ntl`, the T5X models' loss and
their constructor take these as flat keyword arguments (gin binds them one by one) and
build one `Options`; everything below them reads the record, so an option is named,
defaulted and checked in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ntl_jax._core import losses
from ntl_jax._core.number_tokens import check_squash_factor

# What `ntl_kind` accepts besides a function `(prediction, target) -> loss`: a variant
# of `losses.VARIANTS`, or "none" (cross-entropy without computing NTL).
NTL_KINDS = losses.KINDS + ("none",)


@dataclasses.dataclass(frozen=True)
class Options:
    """The objective's options; making one raises `ValueError`/`TypeError` for a bad one.

    - `ntl_kind`: a name of `NTL_KINDS` (`"none"`: no NTL term, none computed), a loss
      function `(prediction, target) -> loss` (NTL-L_p with it) or a `losses.Variant`;
    - `ntl_weight`: lambda, the NTL term's weight (>= 0);
    - `reweigh`, `squash_factor` (only with `"was"`): as in `ntl_was`;
    - `label_smoothing`, `z_loss`: T5X's cross-entropy options;
    - `gce_sigma`: the Gaussian label's width (0: none), exclusive with `label_smoothing`.
    """

    ntl_kind: Any = "was"
    ntl_weight: float = 0.3
    reweigh: bool = False
    squash_factor: float | None = None
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    gce_sigma: float = 0.0

    def __post_init__(self):
        check_squash_factor(self.squash_factor)
        if self.ntl_kind != "none":
            losses.check_kind(self.ntl_kind, self.squash_factor, name="ntl_kind")
        elif self.squash_factor is not None:
            raise ValueError("squash_factor applies only to ntl_kind='was', got ntl_kind='none'")
        losses.check_real("ntl_weight", self.ntl_weight, low=0.0)
        losses.check_bool("reweigh", self.reweigh)
        losses.check_real("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        losses.check_real("z_loss", self.z_loss, low=0.0)
        if losses.check_gce_sigma(self.gce_sigma) > 0 and self.label_smoothing > 0:
            raise ValueError(
                "expected at most one of gce_sigma and label_smoothing (two smoothings of one label), "
                f"got gce_sigma={self.gce_sigma} and label_smoothing={self.label_smoothing}"
            )

    @property
    def variant(self):
        """`ntl_kind` as the number statistics read it: None for `"none"`."""
        return None if self.ntl_kind == "none" else self.ntl_kind

    @property
    def smoothed(self) -> bool:
        """Whether the cross-entropy's label is Gaussian-smoothed (`gce_sigma` > 0)."""
        return self.gce_sigma > 0
