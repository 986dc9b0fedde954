"""NTL inside MaxText's vocabulary tiles.

Under vocabulary tiling (`num_vocab_tiling > 1`) MaxText's `vocab_tiling_nnx_loss`
computes the cross-entropy tile by tile in a `custom_vjp`: its forward and its backward
pass each compute a tile's `[tokens, vocab]` logits and hand them to
`max_utils.cross_entropy_with_logits`. Here that call also computes NTL per token from
the tile's logits. In the backward pass it adds `ntl_weight` x NTL to the
cross-entropy (scaled as the loss normalises its term: for NTL the micro-batch's real
targets over the positions it counts, read from its targets before the tiles run), so
the tiles' own backward pass differentiates CE + NTL and XLA schedules MaxText's step as
it is. (NTL computed beside the tiles, from the hidden states, is the
same loss, but with unrolled layers XLA then schedules the step to need much more memory:
docs/guides/maxtext.md.) In the forward pass the cross-entropy stays MaxText's, and the
tiles' z-loss output, a sum MaxText only logs and never differentiates, carries NTL out:
with `z_loss_multiplier=0` it is otherwise exactly 0. The loss function reads NTL's sum
from it and adds its term to the loss's value.

The forward pass is traced while MaxText's tiled loss is called, the backward pass after
MaxText's `loss_fn` has returned, so what the tiles compute is kept in the step being
traced (`step.Step.tiles`), marked as the backward pass's once the tiled loss returns.
Positions MaxText masks (`targets_segmentation == 0`) enter the tiles with the label -1,
no token: their cross-entropy is multiplied by 0 as before, and NTL counts no target
there, as `weights` do.

This rests on two things MaxText's tiled loss does, both checked: its backward pass calls
the cross-entropy (`step.step` raises at the end of a train step if it never did), and
nothing but the z-loss's own sum reads the z-loss output (`check_z_loss_slot`, once per
launch, raises if its cross-entropy sum reads it or its z-loss sum does not).

`fits` says when this holds: tiling on, no z-loss, a loss whose term is added as it is
(`NumberLoss.combine`), and for a loss that reads across positions
(`reads_one_position`), tiles of whole sequences. Elsewhere NTL is
computed from the hidden states (`loss.py`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import types

import jax
import jax.numpy as jnp

from ntl_jax._core import pipeline
from ntl_jax._core.losses import number_token_loss
from ntl_jax._core.number_losses.number_loss import NumberLoss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax.maxtext import step
from ntl_jax.maxtext.settings import NumberLossSettings
from ntl_jax.maxtext.tokens import number_tokens


@dataclasses.dataclass(frozen=True)
class Tiles:
    settings: NumberLossSettings
    numbers: NumberTokens
    length: int  # positions per sequence
    backward: bool  # the tiles' backward pass: CE + weight x scale x NTL; else CE, NTL in the z-loss
    # NTL's sum normalised as the loss says, per unit of CE's sum (`NumberLoss.normalised`):
    # the whole micro-batch's, from its targets.
    scale: jax.Array = 1.0


# While `check_z_loss_slot` traces the tiled loss: what the cross-entropy adds to its z-loss output.
_MARKER: contextvars.ContextVar = contextvars.ContextVar("ntl_jax.maxtext.tiles.marker", default=None)


def reads_one_position(number_loss: NumberLoss) -> bool:
    """Whether `number_loss` at a position reads that position's target alone
    (`NumberLoss.across_positions`): else its tiles must hold whole sequences."""
    return not number_loss.across_positions


def fits(config, settings: NumberLossSettings, batch: int, length: int) -> bool:
    """Whether NTL can be computed inside MaxText's tiles for a `[batch, length]` batch."""
    if settings.number_loss is None or config.num_vocab_tiling <= 1 or config.z_loss_multiplier != 0:
        return False
    if settings.number_loss.combine != "add":
        return False  # its term's scale is the whole batch's, which no tile knows
    if reads_one_position(settings.number_loss):
        return True
    tile = batch * length // config.num_vocab_tiling
    return tile % length == 0


def per_token_ntl(logits, one_hot_targets, tiles: Tiles):
    """NTL at each of a tile's `[tokens]` positions from its logits `[tokens, vocab]` and
    one-hot targets (a row of zeros: no target).

    Both are read through reductions over the vocabulary, as the cross-entropy reads them
    (`number_token_loss`'s formulation on the TPU): the tile is sharded along the
    vocabulary, and a reduction stays on the devices that hold it, where taking columns
    or gathering from the one-hot rows would collect the tile whole."""
    tokens, vocab = logits.shape
    targets = jnp.where(jnp.max(one_hot_targets, axis=-1) > 0, jnp.argmax(one_hot_targets, axis=-1), -1)
    rows = tokens // tiles.length if tokens % tiles.length == 0 else 1
    per_token = number_token_loss(logits.reshape(rows, tokens // rows, vocab), targets.reshape(rows, -1),
                                  tiles.numbers, number_loss=tiles.settings.number_loss)
    return per_token.reshape(tokens)


def cross_entropy_with_logits(logits, targets, z_loss=0.0):
    """MaxText's `max_utils.cross_entropy_with_logits` `(xent, z_loss)` per token; inside
    tiles that compute NTL (`step.Step.tiles`), `(xent, z_loss + NTL)` in their forward
    pass and `(xent + ntl_weight x scale x NTL, z_loss)` in their backward pass."""
    from maxtext.utils import max_utils

    xent, z = max_utils.cross_entropy_with_logits(logits, targets, z_loss=z_loss)
    marker = _MARKER.get()
    if marker is not None:
        return xent, z + marker
    state = step.current()
    tiles = state.tiles if state is not None else None
    if tiles is None:
        return xent, z
    if tiles.backward:
        state.backward_calls += 1
        if tiles.settings.weight == 0:
            return xent, z
        return xent + tiles.settings.weight * tiles.scale * per_token_ntl(logits, targets, tiles), z
    return xent, z + per_token_ntl(logits, targets, tiles)


class _TileMaxUtils(types.ModuleType):
    """`maxtext.utils.max_utils` as the vocabulary-tiling module sees it: its own, but
    for `cross_entropy_with_logits`."""

    cross_entropy_with_logits = staticmethod(cross_entropy_with_logits)

    def __getattr__(self, name):
        from maxtext.utils import max_utils

        return getattr(max_utils, name)


def tile_max_utils() -> types.ModuleType:
    return _TileMaxUtils("maxtext.utils.max_utils (ntl_jax.maxtext.tiles)")


class _JaxWithoutCustomVjp(types.ModuleType):
    """`jax` as the vocabulary-tiling module sees it while `check_z_loss_slot` traces it:
    `custom_vjp` leaves the function as it is, so its forward pass is traced in line."""

    def __init__(self, stock):
        super().__init__(f"{stock.__name__} (ntl_jax.maxtext.tiles)")
        self._stock = stock

    @staticmethod
    def custom_vjp(fun=None, **_):
        if fun is None:
            return _JaxWithoutCustomVjp.custom_vjp
        fun.defvjp = lambda *args, **kwargs: None
        return fun

    def __getattr__(self, name):
        return getattr(self._stock, name)


@contextlib.contextmanager
def _inline_forward():
    from maxtext.utils import vocabulary_tiling

    stock = vocabulary_tiling.jax
    vocabulary_tiling.jax = _JaxWithoutCustomVjp(stock)
    try:
        yield
    finally:
        vocabulary_tiling.jax = stock


def check_z_loss_slot(stock_tiling_loss, model, hidden_states, data, config, is_train) -> None:
    """Raises `RuntimeError` unless, in MaxText's tiled loss, what the cross-entropy
    returns as its z-loss reaches the z-loss sum and not the cross-entropy sum.

    Traced apart from the step (nothing of it enters the program): the tiled loss's
    forward pass in line, a scalar `marker` added to the z-loss output, and which of its
    two sums read `marker` is what XLA's dead-code elimination keeps of the program."""
    from flax import nnx
    from jax._src.interpreters import partial_eval as pe

    graphdef, state = nnx.split(model)

    def sums(marker, state, hidden_states, data):
        token = _MARKER.set(marker)
        try:
            with _inline_forward():
                return stock_tiling_loss(nnx.merge(graphdef, state), hidden_states, dict(data), config, is_train)
        finally:
            _MARKER.reset(token)

    traced = jax.make_jaxpr(sums)(jnp.float32(0.0), state, hidden_states, data)
    read = [pe.dce_jaxpr(traced.jaxpr, used)[1][0] for used in ([True, False], [False, True])]
    where = ("MaxText's tiled loss (maxtext.utils.vocabulary_tiling.vocab_tiling_nnx_loss), with "
             "z_loss_multiplier=0,")
    fix = ("NTL travels in that slot out of the tiles. The MaxText installed differs from the versions tested "
           "(ntl_jax.maxtext.install.TESTED_MAXTEXT): install one of those")
    if read[0]:
        raise RuntimeError(f"expected {where} to return a cross-entropy sum that reads nothing of the z-loss that "
                           f"max_utils.cross_entropy_with_logits returns; its cross-entropy sum reads it. {fix}")
    if not read[1]:
        raise RuntimeError(f"expected {where} to return the sum of the z-loss that max_utils.cross_entropy_with_logits "
                           f"returns; its z-loss sum does not read it. {fix}")


def number_vocab_tiling_loss(stock_tiling_loss, settings: NumberLossSettings):
    """MaxText's `vocab_tiling_nnx_loss`, returning its `(xent_sum, z_loss_sum)`, with the
    gradient of CE + `settings.weight` x NTL where `fits` holds and a step is traced
    (`step.step`); NTL's sum then goes to the receiver of the `loss_fn` that called it."""
    checked = []  # the z-loss slot, once per launch

    @functools.wraps(stock_tiling_loss)
    def vocab_tiling_nnx_loss(model, hidden_states, data, config, is_train):
        state = step.current()
        batch, length = data["targets"].shape
        if state is None or not state.receivers or not fits(config, settings, batch, length):
            if state is not None:
                state.tiles = None
            return stock_tiling_loss(model, hidden_states, data, config, is_train)
        if not checked:
            check_z_loss_slot(stock_tiling_loss, model, hidden_states, data, config, is_train)
            checked.append(True)
        numbers = number_tokens(config, digit_level=settings.digit_level, prefixed_numbers=settings.prefixed_numbers)
        real = data["targets_segmentation"] != 0
        counted = pipeline.counted_weight(data["targets"], real, numbers, settings.number_loss)
        scale = settings.number_loss.normalised(jnp.float32(1.0), counted, jnp.sum(real, dtype=jnp.float32))
        state.tiles = Tiles(settings, numbers, length, backward=False, scale=jax.lax.stop_gradient(scale))
        xent_sum, ntl_sum = stock_tiling_loss(model, hidden_states,
                                              dict(data, targets=jnp.where(real, data["targets"], -1)), config,
                                              is_train)
        state.tiles = dataclasses.replace(state.tiles, backward=True)
        state.in_tiles += 1
        state.receivers[-1].append(ntl_sum)
        return xent_sum, jnp.zeros_like(ntl_sum)

    return vocab_tiling_nnx_loss
