"""The options of the objective, in one frozen record checked once when it is made.

`cross_entropy_and_ntl`, `fused_cross_entropy_and_ntl`, the T5X models' loss and
their constructor take these as flat keyword arguments (gin binds them one by one) and
build one `Options`; everything below them reads the record, so an option is named,
defaulted and checked in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ntl_jax._core import checks, variants

# What `ntl_kind` accepts besides a function `(prediction, target) -> loss`: a variant
# of `variants.VARIANTS`, or "none" (cross-entropy without computing NTL).
NTL_KINDS = variants.KINDS + ("none",)


@dataclasses.dataclass(frozen=True)
class Options:
    """The objective's options; making one raises `ValueError`/`TypeError` for a bad one.

    - `ntl_kind`: a name of `NTL_KINDS` (`"none"`: no NTL term, none computed), a loss
      function `(prediction, target) -> loss` (NTL-L_p with it) or a `variants.Variant`;
    - `ntl_weight`: lambda, the NTL term's weight (>= 0);
    - `reweigh`, `squash_factor` (only with `"was"`): as in `ntl_was`;
    - `label_smoothing`, `z_loss`: T5X's cross-entropy options;
    - `gce_sigma`: the Gaussian label's width (0: none), exclusive with `label_smoothing`;
    - `max_number_length` (only with `"number_level"`, `"number_level_float"`): the most
      places a number has (None: ntloss's 20), as in `number_level_loss`;
    - `formulation`: how the number statistics are computed (`number_stats`): "auto"
      (each backend's own), or one of `number_stats.FORMULATIONS` everywhere;
    - `smmd_mode`, `smmd_sigma`, `smmd_alpha` (only with `"smmd"`; None: the authors'
      defaults): as in `number_token_loss`.
    """

    ntl_kind: Any = "was"
    ntl_weight: float = 0.3
    reweigh: bool = False
    squash_factor: float | None = None
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    gce_sigma: float = 0.0
    formulation: str = "auto"
    max_number_length: int | None = None
    smmd_mode: str | None = None
    smmd_sigma: float | None = None
    smmd_alpha: float | None = None

    def __post_init__(self):
        checks.check_squash_factor(self.squash_factor)
        if self.ntl_kind != "none":
            checks.check_kind(self.ntl_kind, self.squash_factor)
        elif self.squash_factor is not None:
            raise ValueError(f"squash_factor applies only to ntl_kind in {checks.SQUASHED_KINDS}, got ntl_kind='none'")
        checks.check_smmd_options(self.ntl_kind, **self.smmd)
        checks.check_real("ntl_weight", self.ntl_weight, low=0.0)
        checks.check_bool("reweigh", self.reweigh)
        if self.reweigh and self.variant is not None and self.variant.ceiling is None:
            raise ValueError(f"expected reweigh=False with ntl_kind={self.ntl_kind!r}, which has no largest value "
                             "to charge for probability off the number tokens; got reweigh=True")
        checks.check_real("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        checks.check_real("z_loss", self.z_loss, low=0.0)
        if checks.check_gce_sigma(self.gce_sigma) > 0 and self.label_smoothing > 0:
            raise ValueError(
                "expected at most one of gce_sigma and label_smoothing (two smoothings of one label), "
                f"got gce_sigma={self.gce_sigma} and label_smoothing={self.label_smoothing}"
            )
        checks.check_formulation(self.formulation)
        if self.max_number_length is not None:
            checks.check_max_number_length(self.max_number_length)
            if self.ntl_kind not in variants.NUMBER_LEVEL_KINDS:
                raise ValueError(f"max_number_length applies only to ntl_kind in {variants.NUMBER_LEVEL_KINDS}, "
                                 f"got ntl_kind={self.ntl_kind!r}")

    @property
    def variant(self) -> variants.Variant | None:
        """The number loss, None for `"none"`."""
        if self.ntl_kind == "none":
            return None
        return variants.variant_of(self.ntl_kind, squash_factor=self.squash_factor, smoothed=self.smoothed,
                                   max_number_length=self.max_number_length, **self.smmd)

    @property
    def smmd(self) -> dict:
        """SMMD's options, by name."""
        return dict(smmd_mode=self.smmd_mode, smmd_sigma=self.smmd_sigma, smmd_alpha=self.smmd_alpha)

    @property
    def smoothed(self) -> bool:
        """Whether the cross-entropy's label is Gaussian-smoothed (`gce_sigma` > 0)."""
        return self.gce_sigma > 0
