"""What one traced step of MaxText's shares between the functions `install` puts into it.

MaxText calls them at different times while it traces a step: its `loss_fn` (wrapped,
`loss.py`) and its tiled loss (`tiles.py`) during the forward pass, the cross-entropy
inside the tiles again during the backward pass, traced after `loss_fn` has returned,
and the step reads the loss's aux only after its `value_and_grad`. What they share lives
in a `Step`, current only inside `with step(...)`, which the wrapped `train_step` and
`eval_step` (and fine-tuning's) open around MaxText's own: each step traced starts from
nothing, whatever was traced before it, and nothing outlives it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

_CURRENT: contextvars.ContextVar[Step | None] = contextvars.ContextVar("ntl_jax.maxtext.step", default=None)


@dataclasses.dataclass
class Step:
    """The state of the step being traced.

    - `train`: whether the step differentiates its loss (a train step);
    - `aux`: the last loss aux built in it (`loss.LossAux`), as a one-item list;
    - `receivers`: the lists that the `loss_fn` calls in progress collect NTL's sums into,
      from the tiles (innermost last);
    - `tiles`: what the tiles compute now (`tiles.Tiles`), None outside them;
    - `in_tiles`: how many tiled losses computed NTL inside their tiles;
    - `backward_calls`: how many times the tiles' backward pass called the cross-entropy
      that adds NTL.
    """

    train: bool
    aux: list = dataclasses.field(default_factory=list)
    receivers: list = dataclasses.field(default_factory=list)
    tiles: Any = None
    in_tiles: int = 0
    backward_calls: int = 0


def current() -> Step | None:
    """The step being traced, or None outside `step`."""
    return _CURRENT.get()


@contextlib.contextmanager
def step(*, train: bool):
    """A new `Step`, current inside the block; `train`: the block differentiates the loss.

    Raises:
      RuntimeError: at the end of a train step whose tiled loss computed NTL inside its
        tiles, if their backward pass never called the cross-entropy that adds NTL's
        gradient (`maxtext.utils.vocabulary_tiling`'s `max_utils.cross_entropy_with_logits`).
    """
    state = Step(train)
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)
    if state.train and state.in_tiles and not state.backward_calls:
        raise RuntimeError(
            "expected the backward pass of MaxText's tiled loss (maxtext.utils.vocabulary_tiling's "
            "chunked_cross_entropy_loss) to call max_utils.cross_entropy_with_logits, through which NTL's gradient "
            f"enters the tiles; it computed NTL in {state.in_tiles} forward pass(es) and the backward pass never "
            "called it, so the step would train without NTL. The MaxText installed differs from the versions tested "
            "(ntl_jax.maxtext.install.TESTED_MAXTEXT): install one of those")
