"""How the fused head computes, decided once where it is entered (`plan`) and handed to
its traced functions as one frozen, hashable value (`FusedPlan`): the chip it is traced
for, its vocabulary chunk, how it takes the target's logit, and its backward pass.

Each is an argument, never state read while tracing: a plan is a static argument of
the head's custom gradient, so two plans are two programs in jit's cache, and a program
compiled ahead of time for a TPU from another machine names its chip (`device_kind`).
"""

from __future__ import annotations

import dataclasses

import jax

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
BACKWARDS = ("xla", "pallas", "pallas_interpret")


@dataclasses.dataclass(frozen=True)
class FusedPlan:
    """How the fused head computes (static: part of the program).

    Attributes:
      device_kind: the TPU's `jax.Device.device_kind` traced for (e.g. "TPU v5 lite"),
        None off a TPU.
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


def default_device_kind() -> str | None:
    """The device kind of the default backend's first device if it is a TPU, else None:
    what a plan is made for where no chip is named."""
    device = jax.devices()[0]
    return device.device_kind if device.platform == "tpu" else None


def _tpu_kind(device_kind: str | None) -> str | None:
    """`device_kind` if it names a TPU, else None."""
    return device_kind if device_kind is not None and device_kind.startswith("TPU") else None


def default_chunk_size(num_tokens: int, vocab: int, d_model: int | None = None, device_kind: str | None = None) -> int:
    """Vocabulary columns per chunk, a multiple of 128: `_CHUNK_ELEMENTS / num_tokens`;
    on a TPU (`device_kind`) wider where the hidden states' float32 gradient and a
    chunk's logits do not fit on chip (`_ON_CHIP_BYTES`)."""
    chunk = (_CHUNK_ELEMENTS // max(num_tokens, 1)) // 128 * 128
    device_kind = _tpu_kind(device_kind)
    if d_model is not None and device_kind is not None:
        on_chip = 4 * num_tokens * (d_model + chunk)
        if on_chip > _ON_CHIP_BYTES.get(device_kind, 0):
            widest = (_WIDE_CHUNK_ELEMENTS // max(num_tokens, 1)) // 128 * 128
            chunk = max(chunk, min(8 * d_model // 128 * 128, widest))
    return int(min(max(chunk, 128), vocab))


def plan(hidden_shape, vocab: int, shards=None, *, device_kind: str | None = None, chunk_size: int | None = None,
         backward: str = "xla") -> FusedPlan:
    """The `FusedPlan` of hidden states of `hidden_shape` `[batch, length, D]` and a
    kernel of `vocab` columns, split as `shards` says (a `vocab_parallel.VocabShards`;
    None: on one device), for the chip `device_kind` (None: `default_device_kind()`; a
    kind that is not a TPU's, such as "cpu", plans for the other backends).
    `chunk_size` None: `default_chunk_size`, as many chunks per device as one device
    would stream. `backward`: one of `BACKWARDS` ("pallas_interpret": the Pallas
    kernels interpreted, on any backend).

    Raises:
      TypeError: for a `device_kind` that is not a str.
      ValueError: for another `backward`, or "pallas" off a TPU.
    """
    checks.check_device_kind(device_kind)
    if backward not in BACKWARDS:
        raise ValueError(f"expected backward 'xla', 'pallas' or 'pallas_interpret', got {backward!r}")
    kind = _tpu_kind(default_device_kind() if device_kind is None else device_kind)
    if backward == "pallas" and kind is None:
        raise ValueError(f"expected a TPU for backward='pallas' (its kernels are TPU kernels), got "
                         f"{device_kind or jax.default_backend()} (backward='pallas_interpret' runs them "
                         f"interpreted)")
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
