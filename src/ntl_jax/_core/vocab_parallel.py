"""How a logits kernel's vocabulary is laid out over a device mesh, for the
vocabulary-parallel fused head (`ntl_jax.fused_cross_entropy_and_ntl(...,
vocab_axis=...)`): which mesh, which axis shards the kernel's columns, which axes shard
the tokens, whether the hidden states' sequence is split over the vocabulary's axis too
(sequence parallelism), and the checks that the shapes divide.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec as P

from ntl_jax._core import compat


class VocabShards(NamedTuple):
    """How the kernel's vocabulary is split over a device mesh (static, hashable).

    `vocab_axis` shards the kernel's columns; `batch_axes`, the mesh's other axes,
    shard the tokens (hidden states and targets on their batch axis). With
    `sequence_parallel` the hidden states' sequence axis is split over `vocab_axis` as
    well (`hidden_spec`)."""

    mesh: Any
    vocab_axis: str
    batch_axes: tuple
    sequence_parallel: bool = False


def context_mesh():
    """The mesh in context, or None: `jax.set_mesh`'s, else a `with mesh:` block's."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        return mesh
    return compat.legacy_context_mesh()  # `with mesh:` (T5X's partitioner): no public API reads it


def vocab_shards(vocab_axis, mesh, vocab: int, batch: int, length: int | None = None,
                 sequence_parallel: bool = False) -> VocabShards | None:
    """The `VocabShards` for a kernel of `vocab` columns sharded over mesh axis
    `vocab_axis` and `batch` sequences sharded over the mesh's other axes (with
    `sequence_parallel`, their `length` positions over `vocab_axis` as well); None when
    `vocab_axis` is None or the mesh is a single device.

    Raises:
      ValueError: for an axis the mesh does not have, no mesh, a vocabulary the axis
        size does not divide, a batch the other axes' sizes do not divide, or with
        `sequence_parallel` no `vocab_axis` or a length its size does not divide.
      TypeError: for a `sequence_parallel` that is not a bool.
    """
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"expected sequence_parallel True or False, got {sequence_parallel!r}")
    if vocab_axis is None:
        if mesh is not None:
            raise ValueError("expected vocab_axis (the mesh axis sharding the kernel's columns) with mesh, got None")
        if sequence_parallel:
            raise ValueError("expected vocab_axis (the mesh axis the sequence is split over) with "
                             "sequence_parallel=True, got None")
        return None
    mesh = context_mesh() if mesh is None else mesh
    if mesh is None:
        raise ValueError(
            f"vocab_axis={vocab_axis!r} needs a device mesh: pass mesh=, or call inside `with mesh:` or jax.set_mesh"
        )
    sizes = dict(mesh.shape)
    if vocab_axis not in sizes:
        raise ValueError(f"expected vocab_axis to name an axis of the mesh {tuple(sizes)}, got {vocab_axis!r}")
    if math.prod(sizes.values()) == 1:
        return None
    shards = sizes[vocab_axis]
    if vocab % shards:
        raise ValueError(
            f"expected a vocabulary (kernel columns) divisible by the {shards} shards of mesh axis {vocab_axis!r}, "
            f"got {vocab}; pad the kernel's columns to a multiple of {shards} (T5X rounds vocabularies up to a "
            "multiple of 128; ids beyond the vocabulary are no numbers)"
        )
    batch_axes = tuple(axis for axis in sizes if axis != vocab_axis and sizes[axis] > 1)
    batch_shards = math.prod(sizes[axis] for axis in batch_axes)
    if batch % batch_shards:
        raise ValueError(
            f"expected a batch divisible by the {batch_shards} shards of mesh axes {batch_axes} (the axes other "
            f"than vocab_axis shard the tokens), got {batch}"
        )
    if sequence_parallel and length % shards:
        raise ValueError(
            f"expected a sequence length divisible by the {shards} shards of mesh axis {vocab_axis!r} "
            f"(sequence_parallel=True splits the sequence over it), got {length}"
        )
    return VocabShards(mesh, vocab_axis, batch_axes, sequence_parallel)


def partition_specs(shards: VocabShards):
    """`(tokens, rows, columns, replicated)`: the PartitionSpecs of a `[N]` and an
    `[N, ...]` token array, of the kernel `[d_model, vocab]`, and of a replicated one."""
    batch = shards.batch_axes or None
    return P(batch), P(batch, None), P(None, shards.vocab_axis), P()


def hidden_spec(shards: VocabShards):
    """The PartitionSpec of the `[batch, length, d_model]` hidden states: the batch over
    `batch_axes`, and with `sequence_parallel` the sequence over `vocab_axis`."""
    return P(shards.batch_axes or None, shards.vocab_axis if shards.sequence_parallel else None, None)


def gather_sequence(hidden, shards: VocabShards):
    """Inside `shard_map`: this device's `[batch, length, d_model]` hidden states with the
    whole sequence (gathered over `vocab_axis` with `sequence_parallel`)."""
    if not shards.sequence_parallel:
        return hidden
    return jax.lax.all_gather(hidden, shards.vocab_axis, axis=1, tiled=True)


def sum_over_vocab(d_hidden, shards: VocabShards):
    """Inside `shard_map`: the hidden states' gradient summed over the vocabulary's
    shards, each device keeping its own part of the sequence with `sequence_parallel`
    (a reduce-scatter rather than an all-reduce)."""
    if not shards.sequence_parallel:
        return jax.lax.psum(d_hidden, shards.vocab_axis)
    return jax.lax.psum_scatter(d_hidden, shards.vocab_axis, scatter_dimension=1, tiled=True)
