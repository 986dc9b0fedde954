"""The objective's options, in one frozen record checked once when it is made.

`cross_entropy_and_ntl`, `fused_cross_entropy_and_ntl` and the T5X models take them as
keyword arguments and build one `Options`; everything below them reads the record. The
number loss is one value (`NumberLoss`) that holds and checks its own parameters, and
so is the cross-entropy (`CrossEntropy`); the rest is the weight between the two.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ntl_jax._core import checks
from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, weight_of


@dataclasses.dataclass(frozen=True)
class CrossEntropy:
    """The cross-entropy's options, one value, as the number loss is: what every entry
    point takes as `cross_entropy` (docs/guides/losses.md, "GCE and NTL-WAS-CDF").

    - `label_smoothing`, `z_loss`: T5X's;
    - `gce_sigma`: the Gaussian label's width at number targets (GCE; 0: one-hot),
      exclusive with `label_smoothing`.

    Making one raises `ValueError`/`TypeError` for a bad option.
    """

    label_smoothing: float = 0.0
    z_loss: float = 0.0
    gce_sigma: float = 0.0

    def __post_init__(self):
        checks.check_real("label_smoothing", self.label_smoothing, low=0.0, high=1.0)
        checks.check_real("z_loss", self.z_loss, low=0.0)
        if checks.check_gce_sigma(self.gce_sigma) > 0 and self.label_smoothing > 0:
            raise ValueError(
                "expected at most one of gce_sigma and label_smoothing (two smoothings of one label), "
                f"got gce_sigma={self.gce_sigma} and label_smoothing={self.label_smoothing}"
            )

    @property
    def smoothed(self) -> bool:
        """Whether the label is Gaussian-smoothed (`gce_sigma` > 0)."""
        return self.gce_sigma > 0


# The keywords that spell a `CrossEntropy` field by field where an entry point takes one.
CROSS_ENTROPY_KEYWORDS = tuple(field.name for field in dataclasses.fields(CrossEntropy))


def cross_entropy_of(cross_entropy: CrossEntropy | None = None, **keywords) -> CrossEntropy:
    """`cross_entropy`, or the one its fields spelled as keywords make (`label_smoothing=`,
    `z_loss=`, `gce_sigma=`, those given); never both."""
    given = keywords
    if cross_entropy is None:
        return CrossEntropy(**given)
    if not isinstance(cross_entropy, CrossEntropy):
        raise TypeError(f"expected cross_entropy an ntl_jax.CrossEntropy, got {type(cross_entropy).__name__} "
                        f"{cross_entropy!r}")
    if given:
        raise TypeError(f"expected cross_entropy= or its fields as keywords, not both: got {cross_entropy!r} and "
                        f"{', '.join(f'{k}={v!r}' for k, v in given.items())}")
    return cross_entropy


def takes_cross_entropy_fields(fn):
    """Wraps an entry point that takes `cross_entropy=` so that it also takes that value's
    fields as keywords (`label_smoothing=`, `z_loss=`: T5X's names; `gce_sigma=`), which
    make the one value."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        fields = {name: kwargs.pop(name) for name in CROSS_ENTROPY_KEYWORDS if name in kwargs}
        if fields:
            kwargs["cross_entropy"] = cross_entropy_of(kwargs.get("cross_entropy"), **fields)
        return fn(*args, **kwargs)

    return wrapper


@dataclasses.dataclass(frozen=True)
class Options:
    """The objective's options; making one raises `ValueError`/`TypeError` for a bad one.

    - `number_loss`: a `NumberLoss`, a spec string (`"was"`,
      `"smmd(sigma=2)"`), or None / `"none"` (cross-entropy alone, no number loss
      computed); held resolved;
    - `ntl_weight`: lambda, the number loss's weight (>= 0); None: the loss's own
      (`NumberLoss.default_weight`), held resolved;
    - `cross_entropy`: the cross-entropy's options (`CrossEntropy`).
    """

    number_loss: Any = DEFAULT
    ntl_weight: float | None = None
    cross_entropy: CrossEntropy = CrossEntropy()

    def __post_init__(self):
        object.__setattr__(self, "number_loss", registry.resolve(self.number_loss))
        object.__setattr__(self, "ntl_weight", weight_of(self.number_loss, self.ntl_weight))
        object.__setattr__(self, "cross_entropy", cross_entropy_of(self.cross_entropy))
        checks.check_real("ntl_weight", self.ntl_weight, low=0.0)
