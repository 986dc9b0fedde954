"""The trainer's names of its token-head losses, shared by the step (`step`) and the
catalogue of systems (`systems`), which imports the step only when it needs it.

A token-head loss is "ce" or "gce" (the cross-entropy, or the Gaussian-smoothed one,
alone), or one of those plus a number loss: "<number loss>" or "gce+<number loss>". A
number loss is named by a spec of `ntl_jax.losses.parse`: its name or the label runs
show it by (`NumberLoss.label`), with its parameters in parentheses. The name that
`canonical` gives (the label, off-default parameters only) is the one runs record, so
equal losses are equal names.
"""

from __future__ import annotations

from ntl_jax import losses as _losses

GCE_PREFIX = "gce+"
# The token-head loss a run trains with when none is named: the default number loss.
DEFAULT = _losses.parse(_losses.DEFAULT).shown
# The cross-entropies alone; each logs the default number loss as a diagnostic (at weight 0).
PLAIN = ("ce", "gce")
_FORMS = ("ce, gce, a number loss of ntl_jax.losses by its spec or label, or gce+ one of those, its parameters "
          "in parentheses as in its spec")


def _unknown(loss, others: tuple, reason: str = "") -> ValueError:
    also = f"; or one of {', '.join(others)}" if others else ""
    return ValueError(f"expected a loss name ({_FORMS}{also}), got {loss}{reason}")


def _split(loss: str, others: tuple = ()) -> tuple[str, object]:
    """`(prefix, number loss)`: "gce+" or "", and the `NumberLoss` a token-head loss names."""
    from ntl_jax import losses

    if not isinstance(loss, str):
        raise _unknown(f"{type(loss).__name__} {loss!r}", others)
    prefix = GCE_PREFIX if loss.startswith(GCE_PREFIX) else ""
    try:
        return prefix, losses.parse(loss[len(prefix):])
    except ValueError as e:
        if str(e).startswith("expected a number loss in"):  # no such loss; else its parameters are named
            raise _unknown(repr(loss), others, f" ({e})") from None
        raise


def number_loss(loss: str):
    """The `NumberLoss` a token-head loss names (`ntl_jax.losses.parse`); the default
    number loss for "ce" and "gce", which log it. Raises ValueError for a name that is
    none of these."""
    from ntl_jax import losses

    if loss in PLAIN:
        return losses.resolve(losses.DEFAULT)
    return _split(loss)[1]


def recorded(loss: str) -> str:
    """A canonical token-head loss's name without the spec's `mean_over`, as runs of
    ntl_jax 0.4 and before (which normalised every number loss over the targets)
    recorded it."""
    if loss in PLAIN:
        return loss
    prefix, value = _split(loss)
    return prefix + value.shown_without(_losses.MEAN_OVER)


def canonical(loss: str, others: tuple = ()) -> str:
    """The name runs record for a token-head loss: "ce", "gce", or the prefix and its
    number loss as runs show it (`NumberLoss.shown`: "smmd(mode=smmd)" -> "smmd",
    "was_cdf" -> "ntl-was-cdf"); `others`, the names of other systems, only for the error
    a name that is none of these raises."""
    if loss in PLAIN:
        return loss
    prefix, value = _split(loss, others)
    return prefix + value.shown
