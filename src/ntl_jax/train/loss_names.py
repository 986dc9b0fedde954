"""The trainer's names of its token-head losses, shared by the step (`step`) and the
catalogue of systems (`systems`), which imports the step only when it needs it.

A token-head loss is "ce" or "gce" (the cross-entropy, or the Gaussian-smoothed one,
alone), or one of those plus a number loss: "<number loss>" or "gce+<number loss>". A
number loss is named as a spec of `ntl_jax.losses.parse`, written the trainer's way:
NTL's variants as "ntl-<name>" with dashes ("ntl-was", "ntl-was-cdf"), NTL's successors
by their own names ("del", "dist2", "smmd"), each with its parameters in parentheses
as in the spec ("smmd(mode=mmd)", "ntl-was-cdf(sigma=1)"). A spec as the library
writes it ("was_cdf", "smmd(sigma=3)") is read too. The parameters are the number
loss's; the name that `canonical` gives (off-default parameters only) is the one runs
record, so equal losses are equal names.
"""

from __future__ import annotations

# Number losses the trainer names for themselves rather than as NTL variants: NTL's successors.
OWN_NAMES = ("del", "dist2", "smmd")
NTL_PREFIX = "ntl-"
GCE_PREFIX = "gce+"
# The cross-entropies alone; each logs NTL-WAS as a diagnostic (at weight 0).
PLAIN = ("ce", "gce")
DIAGNOSTIC = "was"
_FORMS = ("ce, gce, ntl-<variant>, del, dist2, smmd, or gce+ one of those, a number loss's parameters in "
          "parentheses as in its spec (e.g. 'smmd(mode=mmd)', 'ntl-was-cdf(sigma=1)')")


def _unknown(loss, others: tuple) -> ValueError:
    also = f"; or one of {', '.join(others)}" if others else ""
    return ValueError(f"expected a loss name ({_FORMS}{also}), got {loss}")


def loss_name(name: str) -> str:
    """The trainer's name of the number loss whose spec name is `name`: "del", "dist2",
    "smmd", or "ntl-<name>" ("was_cdf" -> "ntl-was-cdf")."""
    return name if name in OWN_NAMES else NTL_PREFIX + name.replace("_", "-")


def _spec(loss: str, others: tuple = ()) -> tuple[str, str]:
    """`(prefix, spec)`: "gce+" or "", and the `ntl_jax.losses` spec a token-head loss names."""
    from ntl_jax import losses

    if not isinstance(loss, str):
        raise _unknown(f"{type(loss).__name__} {loss!r}", others)
    prefix = GCE_PREFIX if loss.startswith(GCE_PREFIX) else ""
    body = loss[len(prefix):].strip()
    name, paren, rest = body.partition("(")
    name = name.strip()
    if name.startswith(NTL_PREFIX):
        spec_name = name[len(NTL_PREFIX):].replace("-", "_")
        if spec_name in OWN_NAMES or spec_name not in losses.NAMES:
            raise _unknown(repr(loss), others)
    elif name in losses.NAMES:
        spec_name = name
    else:
        raise _unknown(repr(loss), others)
    return prefix, spec_name + paren + rest


def number_loss(loss: str):
    """The `NumberLoss` a token-head loss names (`ntl_jax.losses.parse`); NTL-WAS for
    "ce" and "gce", which log it. Raises ValueError for a name that is none of these."""
    from ntl_jax import losses

    if loss in PLAIN:
        return losses.parse(DIAGNOSTIC)
    return losses.parse(_spec(loss)[1])


def canonical(loss: str, others: tuple = ()) -> str:
    """The name runs record for a token-head loss: "ce", "gce", or the prefix and the
    trainer's name of its number loss with the parameters off their defaults
    ("smmd(mode=smmd)" -> "smmd", "was_cdf" -> "ntl-was-cdf"); `others`, the names of
    other systems, only for the error a name that is none of these raises."""
    if loss in PLAIN:
        return loss
    prefix, _ = _spec(loss, others)
    value = number_loss(loss)
    return prefix + loss_name(value.name) + value.spec[len(value.name):]
