"""How the fused head computes, decided once where it is entered (`plan`) and handed to
its traced functions as one frozen, hashable value (`FusedPlan`): the chip it is traced
for, its vocabulary chunk, how it takes the target's logit, and its backward pass.

Each is an argument, never state read while tracing: a plan is a static argument of
the head's custom gradient, so two plans are two programs in jit's cache. A program
whose chip is named (`device_kind`) is that chip's; one whose chip is not holds a plan
per platform (`ByPlatform`), and the platform it is lowered for picks one
(`on_platform`, `jax.lax.platform_dependent`): a program traced on one machine and
compiled ahead of time for a TPU is the TPU's.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.extend.core
from jax.interpreters import batching, mlir

from ntl_jax._core import checks

# Default chunk: about this many float32 logits held at a time (32 MiB).
_CHUNK_ELEMENTS = 1 << 23
# On a TPU, the backward pass reads and writes the float32 gradient of the hidden states
# once per chunk. Where the compiler keeps it and a chunk's logits on chip, the default
# chunk costs no such traffic; elsewhere fewer, wider chunks (8 x d_model columns, at
# most this many float32 logits: 512 MiB) cut it. The on-chip room, by device kind, is
# what benchmarks/fused_anchors.py found the compiler to use (docs/performance.md).
_WIDE_CHUNK_ELEMENTS = 1 << 27
_ON_CHIP_BYTES = {"TPU v5 lite": 112 << 20}
# The kind a program lowered for a TPU plans for where no chip is named: a TPU with the
# least on-chip room of `_ON_CHIP_BYTES` (a v5e's), so the narrower chunk wherever that
# fits: the least memory (a chip that keeps less on chip pays HBM traffic for it, never
# memory). A named chip not in the table plans with no room (the wider chunks).
ANY_TPU = "TPU"
BACKWARDS = ("xla", "pallas", "pallas_interpret")


@dataclasses.dataclass(frozen=True)
class FusedPlan:
    """How the fused head computes (static: part of the program).

    Attributes:
      device_kind: the TPU's `jax.Device.device_kind` traced for (e.g. "TPU v5 lite";
        `ANY_TPU` where none is named), None off a TPU.
      chunk: vocabulary columns per chunk, of one device's columns.
      pick_targets: the target's logit picked from each chunk's logits in the chunk's
        one reduction (a TPU: there a gather of the kernel's columns makes the compiler
        transpose the whole kernel first), else gathered from its column.
      backward: "xla" (XLA's chunk loop) or "pallas" (`fused_pallas`'s kernels).
      interpret: the Pallas kernels in Pallas' interpret mode (any backend; tests).
    """

    device_kind: str | None
    chunk: int
    pick_targets: bool
    backward: str = "xla"
    interpret: bool = False

    @property
    def on_tpu(self) -> bool:
        return self.device_kind is not None


@dataclasses.dataclass(frozen=True)
class ByPlatform:
    """The plans of a program whose chip is not named (static, as a `FusedPlan`): `tpu`
    where it is lowered for a TPU, `other` elsewhere (None: a TPU-only program, refused
    where it is lowered for another platform). `on_platform` picks one."""

    tpu: FusedPlan
    other: FusedPlan | None


def _tpu_kind(device_kind: str | None) -> str | None:
    """`device_kind` if it names a TPU, else None."""
    return device_kind if device_kind is not None and device_kind.startswith("TPU") else None


def default_chunk_size(num_tokens: int, vocab: int, d_model: int | None = None, device_kind: str | None = None) -> int:
    """Vocabulary columns per chunk, a multiple of 128: `_CHUNK_ELEMENTS / num_tokens`;
    on a TPU (`device_kind`) wider where the hidden states' float32 gradient and a
    chunk's logits do not fit on chip (`_ON_CHIP_BYTES`; `ANY_TPU`: the least room in it)."""
    chunk = (_CHUNK_ELEMENTS // max(num_tokens, 1)) // 128 * 128
    device_kind = _tpu_kind(device_kind)
    if d_model is not None and device_kind is not None:
        on_chip = 4 * num_tokens * (d_model + chunk)
        if on_chip > _on_chip_bytes(device_kind):
            widest = (_WIDE_CHUNK_ELEMENTS // max(num_tokens, 1)) // 128 * 128
            chunk = max(chunk, min(8 * d_model // 128 * 128, widest))
    return int(min(max(chunk, 128), vocab))


def _on_chip_bytes(device_kind: str) -> int:
    """The on-chip room the TPU `device_kind` plans with (`_ON_CHIP_BYTES`, `ANY_TPU`)."""
    return min(_ON_CHIP_BYTES.values()) if device_kind == ANY_TPU else _ON_CHIP_BYTES.get(device_kind, 0)


def plan(hidden_shape, vocab: int, shards=None, *, device_kind: str | None = None, chunk_size: int | None = None,
         backward: str = "xla") -> FusedPlan | ByPlatform:
    """The plan of hidden states of `hidden_shape` `[batch, length, D]` and a kernel of
    `vocab` columns, split as `shards` says (a `vocab_parallel.VocabShards`; None: on one
    device). `chunk_size` None: `default_chunk_size`, as many chunks per device as one
    device would stream. `backward`: one of `BACKWARDS` ("pallas_interpret": the Pallas
    kernels interpreted, on any backend).

    With `device_kind` (a `jax.Device.device_kind`; one that is not a TPU's, such as
    "cpu", plans for the other backends) the `FusedPlan` for that chip. Without it, a
    `ByPlatform`: lowered for a TPU, a TPU's plan (`ANY_TPU`: a v5e's chunk), elsewhere
    the other backends'; nothing is read from this process's devices. `backward="pallas"`
    without it is a TPU-only program, refused where it is lowered for another platform.

    Raises:
      TypeError: for a `device_kind` that is not a str.
      ValueError: for another `backward`, or "pallas" with a `device_kind` not a TPU's.
    """
    checks.check_device_kind(device_kind)
    if backward not in BACKWARDS:
        raise ValueError(f"expected backward 'xla', 'pallas' or 'pallas_interpret', got {backward!r}")
    if device_kind is not None:
        return _plan_for(_tpu_kind(device_kind), hidden_shape, vocab, shards, chunk_size, backward, device_kind)
    tpu = _plan_for(ANY_TPU, hidden_shape, vocab, shards, chunk_size, backward, ANY_TPU)
    other = None if backward == "pallas" else _plan_for(None, hidden_shape, vocab, shards, chunk_size, backward, None)
    return ByPlatform(tpu=tpu, other=other)


def _plan_for(kind: str | None, hidden_shape, vocab: int, shards, chunk_size: int | None, backward: str,
              named: str | None) -> FusedPlan:
    """The `FusedPlan` for the TPU `kind` (None: the other backends), `named` as the
    caller named the chip (for the error)."""
    if backward == "pallas" and kind is None:
        raise ValueError(f"expected a TPU for backward='pallas' (its kernels are TPU kernels), got {named} "
                         f"(backward='pallas_interpret' runs them interpreted)")
    batch, length, d_model = hidden_shape
    vocab_shards = 1 if shards is None else dict(shards.mesh.shape)[shards.vocab_axis]
    if chunk_size is None:
        chunk_size = default_chunk_size(batch * length, vocab, d_model, kind)
        # As many chunks as one device would stream, each over this device's share of
        # the columns (and of the tokens): per-device memory shrinks with the mesh.
        if vocab_shards > 1:
            chunk_size = max(chunk_size // vocab_shards // 128 * 128, 128)
    return FusedPlan(device_kind=kind, chunk=min(int(chunk_size), vocab // vocab_shards),
                     pick_targets=kind is not None, backward=backward.removesuffix("_interpret"),
                     interpret=backward == "pallas_interpret")


def on_platform(plan: FusedPlan | ByPlatform, fn, *args):
    """`fn(the plan, *args)` (`args` arrays, or trees of them) under the plan for the
    platform the program is lowered for: `plan` itself if it is a `FusedPlan`; a
    `ByPlatform`'s `tpu` on a TPU, its `other` elsewhere. `jax.lax.platform_dependent`
    traces each and lowers one; its `other` None refuses with a `ValueError` where it is
    lowered (or run) off a TPU."""
    if isinstance(plan, FusedPlan):
        return fn(plan, *args)
    if plan.other is None:
        def other(*args):
            return fn(plan.tpu, *_tpu_only(args))
    else:
        other = functools.partial(fn, plan.other)
    return jax.lax.platform_dependent(*args, tpu=functools.partial(fn, plan.tpu), default=other)


_TPU_ONLY_ERROR = ("expected a TPU for backward='pallas' (its kernels are TPU kernels), got {platforms}: a program "
                   "lowered for it without device_kind (backward='pallas_interpret' runs them interpreted)")


def _tpu_only(args):
    """`args` unchanged, where the program is lowered: a `ValueError` (`_TPU_ONLY_ERROR`)."""
    leaves, tree = jax.tree.flatten(args)
    return jax.tree.unflatten(tree, _tpu_only_p.bind(*leaves))


def _refuse_lowering(ctx, *args):
    raise ValueError(_TPU_ONLY_ERROR.format(platforms=" and ".join(ctx.module_context.platforms)))


def _refuse_run(*args):
    raise ValueError(_TPU_ONLY_ERROR.format(platforms=jax.default_backend()))


_tpu_only_p = jax.extend.core.Primitive("ntl_tpu_only")
_tpu_only_p.multiple_results = True
_tpu_only_p.def_abstract_eval(lambda *avals: avals)
_tpu_only_p.def_impl(_refuse_run)
mlir.register_lowering(_tpu_only_p, _refuse_lowering)
batching.primitive_batchers[_tpu_only_p] = lambda args, dims: (_tpu_only_p.bind(*args), dims)
