"""NTL inside MaxText's vocabulary tiles.

Under vocabulary tiling (`num_vocab_tiling > 1`) MaxText's `vocab_tiling_nnx_loss`
computes the cross-entropy tile by tile in a `custom_vjp`: its forward and its backward
pass each compute a tile's `[tokens, vocab]` logits and hand them to
`max_utils.cross_entropy_with_logits`. Here that call also computes NTL per token from
the tile's logits. In the backward pass it adds `ntl_weight` x NTL to the
cross-entropy, so the tiles' own backward pass differentiates CE + NTL and XLA schedules
MaxText's step as it is. (NTL computed beside the tiles, from the hidden states, is the
same loss, but with unrolled layers XLA then schedules the step to need much more memory:
docs/guides/maxtext.md.) In the forward pass the cross-entropy stays MaxText's, and the
tiles' z-loss output, a sum MaxText only logs and never differentiates, carries NTL out:
with `z_loss_multiplier=0` it is otherwise exactly 0. The loss function reads NTL's sum
from it and adds its term to the loss's value.

The forward pass is traced while MaxText's tiled loss is called, the backward pass after
MaxText's `loss_fn` has returned, so what the tiles compute is kept in `_ACTIVE`, set to
the backward pass's once the tiled loss returns. Positions MaxText masks
(`targets_segmentation == 0`) enter the tiles with the label -1, no token: their
cross-entropy is multiplied by 0 as before, and NTL counts no target there, as `weights`
do.

`fits` says when this holds: tiling on, no z-loss, and for the kinds that read a whole
number across positions (`ACROSS_POSITIONS`), tiles of whole sequences. Elsewhere NTL is
computed from the hidden states (`loss.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types

import jax.numpy as jnp

from ntl_jax._core import variants
from ntl_jax._core.losses import number_token_loss
from ntl_jax._core.number_tokens import NumberTokens
from ntl_jax.maxtext.settings import NumberLossSettings
from ntl_jax.maxtext.tokens import number_tokens

# The kinds whose loss at a position reads the targets around it (a number's digits).
ACROSS_POSITIONS = variants.NUMBER_LEVEL_KINDS + ("del",)


@dataclasses.dataclass(frozen=True)
class _Tiles:
    settings: NumberLossSettings
    numbers: NumberTokens
    length: int  # positions per sequence
    backward: bool  # the tiles' backward pass: CE + weight x NTL; else CE, NTL in the z-loss


_ACTIVE: _Tiles | None = None
_SUMS: list[list] = []


def fits(config, settings: NumberLossSettings, batch: int, length: int) -> bool:
    """Whether NTL can be computed inside MaxText's tiles for a `[batch, length]` batch."""
    if config.num_vocab_tiling <= 1 or config.z_loss_multiplier != 0:
        return False
    if settings.kind in ACROSS_POSITIONS:
        tile = batch * length // config.num_vocab_tiling
        return tile % length == 0
    return True


def per_token_ntl(logits, one_hot_targets, tiles: _Tiles):
    """NTL at each of a tile's `[tokens]` positions from its logits `[tokens, vocab]` and
    one-hot targets (a row of zeros: no target).

    Both are read through reductions over the vocabulary, as the cross-entropy reads them
    (`number_token_loss`'s formulation on the TPU): the tile is sharded along the
    vocabulary, and a reduction stays on the devices that hold it, where taking columns
    or gathering from the one-hot rows would collect the tile whole."""
    tokens, vocab = logits.shape
    targets = jnp.where(jnp.max(one_hot_targets, axis=-1) > 0, jnp.argmax(one_hot_targets, axis=-1), -1)
    rows = tokens // tiles.length if tokens % tiles.length == 0 else 1
    s = tiles.settings
    per_token = number_token_loss(logits.reshape(rows, tokens // rows, vocab), targets.reshape(rows, -1),
                                  tiles.numbers, ntl_kind=s.kind, squash_factor=s.squash_factor,
                                  max_number_length=s.max_number_length, **s.smmd)
    return per_token.reshape(tokens)


def cross_entropy_with_logits(logits, targets, z_loss=0.0):
    """MaxText's `max_utils.cross_entropy_with_logits` `(xent, z_loss)` per token; inside
    tiles that compute NTL (`_ACTIVE`), `(xent, z_loss + NTL)` in their forward pass and
    `(xent + ntl_weight x NTL, z_loss)` in their backward pass."""
    from maxtext.utils import max_utils

    xent, z = max_utils.cross_entropy_with_logits(logits, targets, z_loss=z_loss)
    tiles = _ACTIVE
    if tiles is None or (tiles.backward and tiles.settings.weight == 0):
        return xent, z
    ntl = per_token_ntl(logits, targets, tiles)
    if tiles.backward:
        return xent + tiles.settings.weight * ntl, z
    return xent, z + ntl


class _TileMaxUtils(types.ModuleType):
    """`maxtext.utils.max_utils` as the vocabulary-tiling module sees it: its own, but
    for `cross_entropy_with_logits`."""

    cross_entropy_with_logits = staticmethod(cross_entropy_with_logits)

    def __getattr__(self, name):
        from maxtext.utils import max_utils

        return getattr(max_utils, name)


def tile_max_utils() -> types.ModuleType:
    return _TileMaxUtils("maxtext.utils.max_utils (ntl_jax.maxtext.tiles)")


def number_vocab_tiling_loss(stock_tiling_loss, settings: NumberLossSettings):
    """MaxText's `vocab_tiling_nnx_loss`, returning its `(xent_sum, z_loss_sum)`, with the
    gradient of CE + `settings.weight` x NTL where `fits` holds; NTL's sum then goes to
    the caller's `ntl_sums()`."""

    @functools.wraps(stock_tiling_loss)
    def vocab_tiling_nnx_loss(model, hidden_states, data, config, is_train):
        global _ACTIVE
        batch, length = data["targets"].shape
        if not (_SUMS and settings.computes_ntl and fits(config, settings, batch, length)):
            _ACTIVE = None
            return stock_tiling_loss(model, hidden_states, data, config, is_train)
        numbers = number_tokens(config, digit_level=settings.digit_level, prefixed_numbers=settings.prefixed_numbers)
        _ACTIVE = _Tiles(settings, numbers, length, backward=False)
        real = data["targets_segmentation"] != 0
        xent_sum, ntl_sum = stock_tiling_loss(model, hidden_states,
                                              dict(data, targets=jnp.where(real, data["targets"], -1)), config,
                                              is_train)
        _ACTIVE = dataclasses.replace(_ACTIVE, backward=True)
        _SUMS[-1].append(ntl_sum)
        return xent_sum, jnp.zeros_like(ntl_sum)

    return vocab_tiling_nnx_loss


@contextlib.contextmanager
def ntl_sums():
    """Yields a list that holds, when the block ends, NTL's sum over the real targets if
    the tiled loss called in it computed NTL inside its tiles, else nothing."""
    sums: list = []
    _SUMS.append(sums)
    try:
        yield sums
    finally:
        _SUMS.pop()
