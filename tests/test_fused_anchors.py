"""`benchmarks/fused_anchors.py`: its HBM-traffic counter and its numerical check of the
fused cross-entropy anchors (tokamax, jax-cce, ours) against optax on the logits.

Runs where the anchors are installed (benchmarks/fused_anchors_requirements.txt, Python
>= 3.12); skipped elsewhere. Everything here compiles for the CPU: the counter reads any
optimised HLO, and a loop's count must match the same program unrolled.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("tokamax")
pytest.importorskip("jax_cce")
pytest.importorskip("optax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import fused_anchors as fa  # noqa: E402

ROWS, COLS, TRIPS, INNER = 256, 512, 12, 3


def _count(fn, *args) -> tuple[float, float, dict]:
    compiled = jax.jit(fn).lower(*args).compile()
    report = fa.hbm_traffic(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return report["bytes"], float(cost["bytes accessed"]), report


def _read_rows(x, trips):
    """Each trip reads its own [ROWS, COLS] block of x and sums it into a [COLS] vector."""
    def body(i, acc):
        return acc + jnp.sum(jax.lax.dynamic_slice_in_dim(x, i * ROWS, ROWS), axis=0)
    return jax.lax.fori_loop(0, trips, body, jnp.zeros((COLS,), x.dtype))


def _read_rows_unrolled(x, trips):
    acc = jnp.zeros((COLS,), x.dtype)
    for i in range(trips):
        acc = acc + jnp.sum(x[i * ROWS:(i + 1) * ROWS], axis=0)
    return acc


def _nested(x, trips):
    """The same reads as an outer loop of `trips / INNER` trips over inner loops of INNER."""
    def outer(j, acc):
        def inner(i, acc):
            return acc + jnp.sum(jax.lax.dynamic_slice_in_dim(x, (j * INNER + i) * ROWS, ROWS), axis=0)
        return jax.lax.fori_loop(0, INNER, inner, acc)
    return jax.lax.fori_loop(0, trips // INNER, outer, jnp.zeros((COLS,), x.dtype))


def test_loop_counted_per_trip_matches_unrolled():
    x = jax.ShapeDtypeStruct((TRIPS * ROWS, COLS), jnp.float32)
    block = ROWS * COLS * 4
    looped, xla_looped, report = _count(lambda x: _read_rows(x, TRIPS), x)
    unrolled, _, _ = _count(lambda x: _read_rows_unrolled(x, TRIPS), x)
    nested, _, nested_report = _count(lambda x: _nested(x, TRIPS), x)
    assert [loop["trips"] for loop in report["loops"]] == [TRIPS]
    assert sorted(loop["multiplier"] for loop in nested_report["loops"]) == [TRIPS // INNER, TRIPS]
    # the same traffic whichever way the program is written (on the CPU each block is
    # read, copied out as a slice and read again: ~3 blocks a trip; the accumulator's
    # COLS floats a trip are the difference between the forms, < 1%)
    for count in (looped, unrolled, nested):
        assert TRIPS * block <= count <= 3.1 * TRIPS * block, (looped, unrolled, nested)
    assert abs(looped - unrolled) <= 0.02 * unrolled
    assert abs(nested - unrolled) <= 0.02 * unrolled
    # XLA's own figure counts the body once
    assert xla_looped < 0.5 * looped


def test_trip_count_from_condition_and_backend_config():
    hlo = jax.jit(lambda x: _read_rows(x, 7)).lower(
        jax.ShapeDtypeStruct((7 * ROWS, COLS), jnp.float32)).compile().as_text()
    comps, entry = fa.parse_module(hlo)
    loops = [(name, i) for name, body in comps.items() for i in body if i.opcode == "while"]
    assert len(loops) == 1
    name, loop = loops[0]
    assert fa.trip_count(comps, comps[name], loop) == 7
    attrs = loop.attrs
    loop.attrs = attrs.split("backend_config=")[0]  # from the condition and the counter alone
    assert fa.trip_count(comps, comps[name], loop) == 7
    loop.attrs = loop.attrs + ', backend_config={"known_trip_count":{"n":"5"}}'
    assert fa.trip_count(comps, comps[name], loop) == 5


def test_loop_free_program_agrees_with_xla():
    """Without loops, compiled for a v5e: the count is XLA's own figure to 1% (optax CE
    forward + backward on bf16 logits; at the benchmark's shape 0.997x)."""
    import optax

    try:
        device = fa.tpu_device("v5e")
    except Exception as exc:  # noqa: BLE001 - no libtpu
        pytest.skip(f"cannot compile for a TPU here: {exc}")
    sh = jax.sharding.SingleDeviceSharding(device)
    # at the benchmark's shape: at small ones XLA keeps buffers in VMEM, which its
    # figure counts and ours does not
    z = jax.ShapeDtypeStruct((fa.TOKENS, 128_256), jnp.bfloat16, sharding=sh)
    t = jax.ShapeDtypeStruct((fa.TOKENS,), jnp.int32, sharding=sh)
    ours, xla, report = _count(jax.value_and_grad(
        lambda z, t: jnp.mean(optax.softmax_cross_entropy_with_integer_labels(z.astype(jnp.float32), t))), z, t)
    assert not report["loops"]
    assert abs(ours - xla) <= 0.01 * xla, (ours, xla)


def test_shape_bytes_leaves_out_vmem():
    assert fa.shape_bytes("bf16[8,128]{1,0:T(8,128)(2,1)}") == 8 * 128 * 2
    assert fa.shape_bytes("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}") == 0
    assert fa.shape_bytes("(f32[4]{0}, s32[2,2]{1,0:T(2,128)S(1)})") == 16


def test_pallas_model_counts_block_changes():
    """A [4, 2] grid over a [512, 256] operand in [128, 128] blocks indexed by (i, j):
    each block copied in once; indexed by (0, j), the block changes every step."""
    from jax.experimental import pallas as pl

    spec = pl.BlockSpec((128, 128), lambda i, j: (i, j))
    fixed_row = pl.BlockSpec((128, 128), lambda i, j: (0, j))
    record = {"name": "k", "grid": (4, 2), "in": [((512, 256), "float32"), ((512, 256), "float32")],
              "out": [((512, 256), "float32")], "in_specs": [spec, fixed_row], "out_specs": [spec]}
    model = fa.pallas_model(record)
    block = 128 * 128 * 4
    assert [p["copies"] for p in model["operands"]] == [8, 8, 8]
    assert model["bytes"] == 3 * 8 * block
    record["in_specs"] = [pl.BlockSpec((128, 128), lambda i, j: (i, 0)), spec]
    assert fa.pallas_model(record)["operands"][0]["copies"] == 4


def test_numerical_check_passes_and_catches_padding_bug():
    """Ours and jax-cce agree with optax at V 2,176, 2,048 and 1,024 (256 tokens);
    tokamax's chunked_xla only where V is a multiple of its vocabulary block (2,048 by
    default; the padded columns enter its log-normaliser): the check reports the other
    two as failed, as it would any anchor that returns a wrong loss."""
    names = {"ours CE", "ours CE + NTL-WAS digits", "tokamax/chunked_xla", "jax_cce"}
    impls = [i for i in fa.IMPLS if i.name in names]
    out = fa.numerical_check(impls, tokens=256, hidden=64, vocabs=(2176, 2048, 1024), log=None)
    for key, row in out.items():
        assert "error" not in row, (key, row)
        if key in ("tokamax/chunked_xla @V=2176", "tokamax/chunked_xla @V=1024"):
            assert row["passed"] is False and row["loss_rel_err"] > 1e-2, row
        else:
            assert row["passed"] is True, (key, row)
    ntl = out["ours CE + NTL-WAS digits @V=2176"]
    assert ntl["ntl_weight_0_equals_ce_only"] and ntl["total"] > ntl["ce_part"]
    assert np.isclose(ntl["total"], ntl["unfused_total"], rtol=fa.LOSS_RTOL)
