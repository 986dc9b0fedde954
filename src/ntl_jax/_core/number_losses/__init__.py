"""The number losses, each one value (`NumberLoss`), a file per family, as optax lays
out its losses: the type (`number_loss`), NTL's family (`ntl`), each successor in its
own file (`digit_entropy`, `dist2`, `smmd`, `ntil`), and the registry with the spec
grammar (`registry`), which names them.

A loss computes its per-position value from statistics of the number tokens' logits
(`number_stats.NumberStats`), reading what its `reads` names; its `reference` is the
textbook formula on the number columns, which the tests hold every formulation against.
"""

# Every loss names itself through the registry's table (`NumberLoss.spec`): importing any
# of these files fills it.
from ntl_jax._core.number_losses import registry  # noqa: F401
