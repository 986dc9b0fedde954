"""The fused head on the TPU compiler, compiled ahead of time for one v5e chip with libtpu
(skipped without it):

- it holds no copy of the kernel: a gather of the kernel's columns (the target's, the
  number tokens') makes the compiler lay out a transposed copy of the whole kernel
  (libtpu 0.0.50 and later), so the head picks the target's logit inside its chunk loop
  and the number columns one by one;
- it compiles with a number token at id 0: a scatter of the number tokens' indices into
  a vocabulary-wide table aborted libtpu 0.0.52's compiler there;
- what the TPU computes instead (the target's logit picked chunk by chunk, the number
  columns one by one) equals what the other backends gather, on the CPU;
- the opt-in Pallas backward's two kernels compile, their blocks within scoped VMEM;
- without `device_kind`, the platform a program is lowered for picks its plan: traced on
  this CPU machine and lowered for the v5e it is the TPU's program, not the CPU's.

`.ci/maxtext`'s environment has such a libtpu; the test environment's older one made
neither the copy nor the abort, so there these tests hold either way.
"""

from __future__ import annotations

import re
import sys

import pytest

pytest.importorskip("optax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tests.test_tpu_cost import BENCHMARKS  # noqa: E402

if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import tpu_cost  # noqa: E402
import vocabularies  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax._core import fused, fused_plan  # noqa: E402

TOKENS, D, V = 1024, 2048, 65536  # a 256 MiB bf16 kernel; a default chunk of 8,192 columns


@pytest.fixture(scope="module")
def chip():
    try:
        return tpu_cost.tpu_devices()[0]  # one chip of v5e:2x2
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("table", ["digits", "llama3"])
def test_the_fused_head_holds_no_copy_of_the_kernel(chip, table):
    nt = vocabularies.llama3_number_tokens(V) if table == "llama3" else tpu_cost.number_tokens("t5")

    def loss(hidden, kernel, targets):
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, ntl_weight=0.3,
                                                   label_smoothing=0.1, device_kind=chip.device_kind)[0]

    sharding = jax.sharding.SingleDeviceSharding(chip)
    args = (jax.ShapeDtypeStruct((1, TOKENS, D), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((D, V), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((1, TOKENS), jnp.int32, sharding=sharding))
    compiled = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(*args).compile()
    kernel_bytes = D * V * 2
    temp = compiled.memory_analysis().temp_size_in_bytes
    # The chunk's float32 logits and their gradient: 48 MiB of it.
    assert temp < kernel_bytes / 4, (temp, kernel_bytes)


@pytest.mark.parametrize("first", [0, 7])
def test_the_fused_head_compiles_with_a_number_token_at_id_0(chip, first):
    pieces = ["x"] * 4096
    pieces[first:first + 10] = [str(i) for i in range(10)]
    nt = ntl_jax.NumberTokens.from_pieces(pieces)

    def loss(hidden, kernel, targets):
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, ntl_weight=0.3,
                                                   device_kind=chip.device_kind)[0]

    sharding = jax.sharding.SingleDeviceSharding(chip)
    args = (jax.ShapeDtypeStruct((1, 256, 128), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((128, 4096), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((1, 256), jnp.int32, sharding=sharding))
    # An abort of the compiler ends this process: the test fails with it.
    compiled = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(*args).compile()
    assert compiled.memory_analysis().temp_size_in_bytes > 0


def _kernel_gathers(lowered, kernel_type: str) -> list[str]:
    """The result types of the gathers from the kernel (`kernel_type`) in a lowered program."""
    lines = [line for line in lowered.as_text().splitlines() if '"stablehlo.gather"' in line]
    return sorted(re.search(r"-> (tensor<[^>]*>)", line).group(1) for line in lines
                  if re.search(r"\}> : \(" + re.escape(kernel_type), line))


def test_the_chip_is_named_and_each_gets_its_own_program(chip):
    # One jitted function, the same shapes: traced for a CPU, then ahead of time for a
    # v5e chip, each named by `device_kind`. Each trace has its own program in jit's
    # cache: the CPU's gathers the target's column and the number tokens' columns from
    # the kernel; the TPU's gathers nothing from it (the target's logit is picked in
    # the chunk's one reduction, a column at a time for the number tokens).
    nt = ntl_jax.NumberTokens.from_pieces(["x"] * 7 + [str(i) for i in range(10)] + ["x"] * 4079)
    traced = []

    def loss(hidden, kernel, targets, device_kind):
        traced.append(device_kind)
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, device_kind=device_kind)[0]

    step = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnames="device_kind")

    def args(device):
        sharding = jax.sharding.SingleDeviceSharding(device)
        return (jax.ShapeDtypeStruct((1, 256, 128), jnp.bfloat16, sharding=sharding),
                jax.ShapeDtypeStruct((128, 4096), jnp.bfloat16, sharding=sharding),
                jax.ShapeDtypeStruct((1, 256), jnp.int32, sharding=sharding))

    cpu = step.lower(*args(jax.devices("cpu")[0]), device_kind="cpu")
    tpu = step.lower(*args(chip), device_kind=chip.device_kind)
    assert step.lower(*args(jax.devices("cpu")[0]), device_kind="cpu").as_text() == cpu.as_text()
    assert traced == ["cpu", chip.device_kind]  # the CPU's lowered again from jit's cache
    kernel = "tensor<128x4096xbf16>"
    assert set(_kernel_gathers(cpu, kernel)) == {"tensor<128x10xbf16>", "tensor<128x256xbf16>"}
    assert _kernel_gathers(tpu, kernel) == []
    one_reduction = r"stablehlo.reduce(\(%\w+ init: %\w+\),? ){3}across dimensions = \[1\] : \(tensor<256x4096xf32>"
    assert re.search(one_reduction, tpu.as_text()) and not re.search(one_reduction, cpu.as_text())
    assert tpu.compile().memory_analysis().temp_size_in_bytes < 128 * 4096 * 2


def _small_args(device, dtype=jnp.bfloat16):
    sharding = jax.sharding.SingleDeviceSharding(device)
    return (jax.ShapeDtypeStruct((1, 256, 128), dtype, sharding=sharding),
            jax.ShapeDtypeStruct((128, 4096), dtype, sharding=sharding),
            jax.ShapeDtypeStruct((1, 256), jnp.int32, sharding=sharding))


def test_without_a_chip_named_the_platform_lowered_for_picks_the_program(chip):
    # One jitted function, no `device_kind`, traced on this CPU machine: lowered for the
    # CPU it is the CPU's program (the target's and the number tokens' columns gathered),
    # lowered for a v5e chip the TPU's (nothing gathered from the kernel, the target's
    # logit in the chunk's one reduction), at the cost of the program named for a v5e.
    nt = ntl_jax.NumberTokens.from_pieces(["x"] * 7 + [str(i) for i in range(10)] + ["x"] * 4079)

    def loss(hidden, kernel, targets, device_kind=None):
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, device_kind=device_kind)[0]

    step = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnames="device_kind")
    cpu = step.lower(*_small_args(jax.devices("cpu")[0]))
    tpu = step.lower(*_small_args(chip))
    named = step.lower(*_small_args(chip), device_kind=chip.device_kind)
    kernel = "tensor<128x4096xbf16>"
    assert set(_kernel_gathers(cpu, kernel)) == {"tensor<128x10xbf16>", "tensor<128x256xbf16>"}
    assert _kernel_gathers(tpu, kernel) == [] == _kernel_gathers(named, kernel)
    one_reduction = r"stablehlo.reduce(\(%\w+ init: %\w+\),? ){3}across dimensions = \[1\] : \(tensor<256x4096xf32>"
    assert re.search(one_reduction, tpu.as_text()) and not re.search(one_reduction, cpu.as_text())
    tpu, named = tpu.compile(), named.compile()
    for key in ("flops", "bytes accessed"):
        assert tpu.cost_analysis()[key] == named.cost_analysis()[key], key
    assert tpu.memory_analysis().temp_size_in_bytes == named.memory_analysis().temp_size_in_bytes < 128 * 4096 * 2


def test_without_a_chip_named_the_pallas_backward_is_a_tpu_program(chip):
    # backward="pallas" without `device_kind`: lowered for the v5e chip, its two kernels;
    # lowered for the CPU, refused by name (where the chip is named "cpu", when planned).
    nt = ntl_jax.NumberTokens.from_pieces(["x"] * 7 + [str(i) for i in range(10)] + ["x"] * 4079)

    def loss(hidden, kernel, targets):
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, backward="pallas")[0]

    step = jax.jit(jax.value_and_grad(loss, (0, 1)))
    text = step.lower(*_small_args(chip)).compile().as_text()
    assert "ntl_hidden_grad" in text and "ntl_kernel_grad" in text
    with pytest.raises(ValueError, match="expected a TPU for backward='pallas'.*got cpu: a program lowered for it "
                                         "without device_kind"):
        step.lower(*_small_args(jax.devices("cpu")[0]))


@pytest.mark.parametrize("compared", [128, 0], ids=["compared", "searched"])
def test_the_number_index_of_each_column(compared, monkeypatch):
    monkeypatch.setattr(fused, "_COMPARED_IDS", compared)
    local_ids = jnp.array([9, 0, 4096, 5, 4096, 3], jnp.int32)  # 4096: another shard's, one past the end
    columns = jnp.arange(12, dtype=jnp.int32)
    expected = [1, -1, -1, 5, -1, 3, -1, -1, -1, 0, -1, -1]
    assert fused._number_index(columns, local_ids).tolist() == expected
    assert jax.jit(fused._number_index)(columns + 4090, local_ids).tolist() == [-1] * 6 + [2] + [-1] * 5


def test_the_columns_one_by_one_are_the_columns():
    kernel = jax.random.normal(jax.random.key(0), (6, 40), jnp.bfloat16)
    ids = jnp.array([39, 0, 7, 7, 12], jnp.int32)
    rows = jax.jit(fused.columns_one_by_one)(kernel, ids)
    assert rows.dtype == kernel.dtype
    assert jnp.array_equal(rows, kernel[:, ids].T)
    for kind in (None, "TPU v5 lite"):
        plan = fused_plan.plan((1, 8, 6), 40, device_kind=kind or "cpu")
        assert jnp.array_equal(fused._columns(kernel, ids, plan), kernel[:, ids].T)


@pytest.mark.parametrize("offset", [0, 24])
def test_the_target_picked_in_the_loop_is_the_gathered_one(offset):
    # What a TPU streams (the target's logit picked chunk by chunk) equals what the
    # other backends do (its column gathered), here on the CPU; 3 chunks of 16, the last
    # moved back over 8 columns, and targets on this shard of [offset, offset + 40) or not.
    keys = jax.random.split(jax.random.key(1), 3)
    hidden = jax.random.normal(keys[0], (12, 8), jnp.float32)
    kernel = jax.random.normal(keys[1], (8, 40), jnp.float32)
    targets = jax.random.randint(keys[2], (12,), 0, 64)
    local_ids = jnp.array([3, 17, 40], jnp.int32)  # 40: another shard's
    outs = [fused._stream(hidden, kernel, targets, local_ids, jnp.int32(offset), chunk=16, with_top=True,
                          pick_targets=pick) for pick in (True, False)]
    for picked, gathered in zip(*outs):
        np.testing.assert_allclose(picked, gathered, rtol=1e-6, atol=1e-6)
    owned = (targets >= offset) & (targets < offset + 40)
    columns = jnp.clip(targets - offset, 0, 39)[:, None]
    expected = jnp.where(owned, jnp.take_along_axis(hidden @ kernel, columns, 1)[:, 0], 0)
    np.testing.assert_allclose(outs[0][1], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, table", [(jnp.bfloat16, "llama3"), (jnp.float32, "digits")], ids=["bf16", "f32"])
def test_the_pallas_backward_compiles_for_the_chip(chip, dtype, table):
    # Two Mosaic kernels for the backward pass, with blocks that fit their scoped VMEM
    # (the compiler refuses a kernel that does not): in bf16 at the 1,110-token table, in
    # float32 (the number columns picked at full precision) at the digits.
    nt = vocabularies.llama3_number_tokens(V) if table == "llama3" else tpu_cost.number_tokens("t5")

    def loss(hidden, kernel, targets):
        return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, nt, ntl_weight=0.3, label_smoothing=0.1,
                                                   backward="pallas", device_kind=chip.device_kind)[0]

    sharding = jax.sharding.SingleDeviceSharding(chip)
    args = (jax.ShapeDtypeStruct((1, TOKENS, D), dtype, sharding=sharding),
            jax.ShapeDtypeStruct((D, V), dtype, sharding=sharding),
            jax.ShapeDtypeStruct((1, TOKENS), jnp.int32, sharding=sharding))
    compiled = jax.jit(jax.value_and_grad(loss, (0, 1))).lower(*args).compile()
    text = compiled.as_text()
    assert "ntl_hidden_grad" in text and "ntl_kernel_grad" in text
    if dtype == jnp.bfloat16:
        # In float32, libtpu 0.0.52 converts the whole kernel to bf16 once for the forward
        # loop's default-precision products (backward="xla" too): not this pass's memory.
        assert compiled.memory_analysis().temp_size_in_bytes < D * V * 2 / 4
