"""`fused_cross_entropy_and_ntl` against `cross_entropy_and_ntl(hidden @ kernel, ...)`."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import NumberTokens, cross_entropy_and_ntl, fused_cross_entropy_and_ntl, losses
from ntl_jax._core.fused_plan import default_chunk_size
from tests import xla_flags
from tests.objective_options import FACTORS, OPTIONS

# A vocabulary whose number tokens sit in several chunks of 7 columns (and the last,
# partial chunk): 69 ids, digits 3..12, "." 13, "42" at 60 (digit_level=False only).
PIECES = ["<pad>", "</s>", "a"] + [str(d) for d in range(10)] + ["."] + [f"w{i}" for i in range(46)] + ["42"] + [
    f"x{i}" for i in range(8)
]
NT = NumberTokens.from_pieces(PIECES)
NT_WIDE = NumberTokens.from_pieces(PIECES, digit_level=False)
B, L, D = 3, 13, 8
# float32: the loss and gradients go through different summation orders; a few
# hundred ulps of the largest value (2e-5 relative) is the bound.
RTOL = 2e-5


def _inputs(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(B, L, D)), dtype)
    kernel = jnp.asarray(rng.normal(size=(D, len(PIECES))), dtype)
    # Mostly digits (runs of them make numbers), some "." and words, padding at the end.
    targets = rng.choice(np.r_[np.arange(3, 14), [2, 20, 60]], size=(B, L)).astype(np.int32)
    targets[:, -2:] = 0
    weights = (rng.random((B, L)) > 0.15).astype(np.float32) * (targets != 0)
    return hidden, kernel, jnp.asarray(targets), jnp.asarray(weights)


def _packed():
    segment_ids = np.array([[1] * 5 + [2] * 6 + [0] * 2, [1] * 13, [1] * 3 + [2] * 3 + [3] * 5 + [0] * 2])
    positions = np.concatenate([np.arange(n) for n in (5, 6, 2, 13, 3, 3, 5, 2)]).reshape(B, L)
    return {"decoder_segment_ids": jnp.asarray(segment_ids), "decoder_positions": jnp.asarray(positions)}


def _both(hidden, kernel, targets, number_tokens=NT, chunk_size=7, fused_only=None, **kwargs):
    """`(loss, parts, grads)` of the unfused objective and of the fused head, which also
    takes `fused_only` (a dict of its own arguments)."""
    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, number_tokens, **kwargs)

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, number_tokens, chunk_size=chunk_size,
                                           **(fused_only or {}), **kwargs)

    out = []
    for f in (unfused, fused):
        (loss, parts), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(hidden, kernel)
        out.append((loss, parts, grads))
    return out


def _assert_close(a, b, rtol=RTOL, what=""):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.max(np.abs(a)), 1e-30)
    assert np.max(np.abs(a - b)) <= rtol * scale, f"{what}: max |diff| {np.max(np.abs(a - b))} vs scale {scale}"


def _assert_same(unfused, fused):
    (loss_u, parts_u, grads_u), (loss_f, parts_f, grads_f) = unfused, fused
    _assert_close(loss_u, loss_f, what="loss")
    for name in parts_u:
        _assert_close(parts_u[name], parts_f[name], what=name)
    _assert_close(grads_u[0], grads_f[0], what="d hidden")
    _assert_close(grads_u[1], grads_f[1], what="d kernel")


@pytest.mark.parametrize("name", OPTIONS)
def test_every_variant_equals_the_unfused_objective(name):
    hidden, kernel, targets, weights = _inputs()
    _assert_same(*_both(hidden, kernel, targets, weights=weights, **OPTIONS[name]))


@pytest.mark.parametrize("factor", FACTORS, ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_every_loss_normalizing_factor_packed_or_not(factor, packed):
    hidden, kernel, targets, weights = _inputs(seed=1)
    segments = _packed() if packed else {}
    _assert_same(*_both(hidden, kernel, targets, weights=weights, loss_normalizing_factor=factor, **segments))


@pytest.mark.parametrize("chunk_size", [1, 5, 7, 64, 69, 1000, None])
def test_any_chunk_size_gives_the_same_result(chunk_size):
    # Multi-digit numbers everywhere: the number-level loss joins digits across positions.
    hidden, kernel, targets, weights = _inputs(seed=2)
    _assert_same(*_both(hidden, kernel, targets, chunk_size=chunk_size, weights=weights,
                        number_loss=losses.number_level(reweigh=True), label_smoothing=0.05))


def test_number_tokens_beyond_single_digits():
    hidden, kernel, targets, weights = _inputs(seed=3)
    _assert_same(*_both(hidden, kernel, targets, number_tokens=NT_WIDE, weights=weights,
                        number_loss=losses.was(reweigh=True)))


def test_without_weights_and_under_jit():
    hidden, kernel, targets, _ = _inputs(seed=4)
    unfused, fused = _both(hidden, kernel, targets, ntl_weight=0.3)
    _assert_same(unfused, fused)
    jitted = jax.jit(lambda h, k: fused_cross_entropy_and_ntl(h, k, targets, NT, chunk_size=7)[0])
    _assert_close(unfused[0], jitted(hidden, kernel), what="jit loss")


def test_ignored_positions_contribute_nothing_whatever_their_hidden_states():
    hidden, kernel, targets, weights = _inputs(seed=5)
    # NaN and inf hidden states at weight-0 positions, and a target id outside the vocabulary.
    hidden = hidden.at[0, -1].set(jnp.nan).at[1, -2].set(jnp.inf)
    targets = targets.at[2, 0].set(len(PIECES) + 5)
    loss, grads = jax.value_and_grad(
        lambda h, k: fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, chunk_size=7)[0],
        argnums=(0, 1),
    )(hidden, kernel)
    assert np.isfinite(float(loss))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    clean = hidden.at[0, -1].set(0.0).at[1, -2].set(0.0)
    _assert_close(loss, cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", clean, kernel), targets, NT,
                                              weights=weights)[0])


def test_bfloat16_inputs_accumulate_in_float32():
    hidden, kernel, targets, weights = _inputs(seed=6, dtype=jnp.bfloat16)
    loss, parts = fused_cross_entropy_and_ntl(hidden, kernel, targets, NT, weights=weights, chunk_size=7)
    # The reference: the same bf16 values, multiplied and reduced in float32.
    exact = cross_entropy_and_ntl(
        jnp.einsum("bld,dv->blv", hidden.astype(jnp.float32), kernel.astype(jnp.float32)), targets, NT,
        weights=weights,
    )[0]
    _assert_close(exact, loss, rtol=1e-5, what="bf16 loss")
    grads = jax.grad(
        lambda h, k: fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, chunk_size=7)[0],
        argnums=(0, 1),
    )(hidden, kernel)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]


def test_tied_embedding_and_logit_scaling_as_documented():
    hidden, kernel, targets, weights = _inputs(seed=7)
    embedding = kernel.T  # [vocab, d_model]
    unfused = cross_entropy_and_ntl(jnp.einsum("bld,vd->blv", hidden, embedding) / np.sqrt(D), targets, NT,
                                    weights=weights)[0]
    fused = fused_cross_entropy_and_ntl(hidden / np.sqrt(D), embedding.T, targets, NT, weights=weights)[0]
    _assert_close(unfused, fused)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(kernel=jnp.zeros((D + 1, len(PIECES)))), r"kernel of shape \[d_model=8, vocab\]"),
        (dict(kernel=jnp.zeros((D, len(PIECES) - 1))), "expected a kernel with >= 69 columns"),
        (dict(hidden=jnp.zeros((B, L))), "hidden of rank 3"),
        (dict(targets=jnp.zeros((B, L + 1), jnp.int32)), "targets of shape"),
        (dict(targets=jnp.zeros((B, L))), "integer targets"),
        (dict(chunk_size=0), "chunk_size None or a positive int"),
        (dict(chunk_size=2.5), "chunk_size None or a positive int"),
        (dict(device_kind=jax.devices()[0]), "expected device_kind None or a jax.Device.device_kind"),
        (dict(ntl_weight=-1.0), "ntl_weight"),
        (dict(number_loss="wass"), "number loss in.*got 'wass'"),
        (dict(number_loss=len), "expected number_loss a NumberLoss or a spec string, got the function"),
        (dict(ntl_kind="mse"), r"no longer takes ntl_kind=.*number_loss="),
        (dict(reweigh=True), r"no longer takes reweigh=.*ntl_jax\.losses\.was\(reweigh=True\)"),
        (dict(weights=jnp.full((B, L), -1.0)), "non-negative weights"),
        (dict(hidden=[[[1.0] * D] * L] * B), "Python list"),
    ],
)
def test_bad_inputs_are_named(change, message):
    hidden, kernel, targets, _ = _inputs()
    args = dict(hidden=hidden, kernel=kernel, targets=targets)
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises((ValueError, TypeError), match=message):
        fused_cross_entropy_and_ntl(args["hidden"], args["kernel"], args["targets"], NT, **kwargs)


def test_default_chunk_size():
    assert default_chunk_size(4096, 128256) == 2048
    assert default_chunk_size(16384, 32128) == 512
    assert default_chunk_size(10**7, 32128) == 128
    assert default_chunk_size(8, 300) == 300
    # Off a TPU d_model changes nothing.
    assert default_chunk_size(8192, 128256, 4096) == 1024


@pytest.mark.parametrize("chip, llama3, qwen3, gemma", [
    # A v5e keeps the hidden states' float32 gradient and a chunk's logits on chip up to
    # 112 MiB: Qwen3's (32 + 32 MiB) and Gemma's (72 + 32 MiB), not Llama-3's (128 MiB alone).
    ("TPU v5 lite", 16384, 1024, 1024),
    # Elsewhere 8 x d_model columns, at most 512 MiB of float32 logits (16,384 columns here).
    ("TPU v5", 16384, 8192, 16384),
    # A TPU not named (a program lowered for a TPU without `device_kind`): a v5e's room.
    ("TPU", 16384, 1024, 1024),
    ("cpu", 1024, 1024, 1024),
])
def test_default_chunk_size_on_each_chip(chip, llama3, qwen3, gemma):
    assert [default_chunk_size(8192, vocab, d, chip) for vocab, d in ((128256, 4096), (151936, 1024), (256000, 2304))] \
        == [llama3, qwen3, gemma]
    assert default_chunk_size(64, 3000, 4096, "TPU v5") == 3000  # never past the vocabulary


def _compiled_value_and_grad(f, *shapes):
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*shapes).compile()


def test_memory_at_4096_tokens_and_a_128256_vocabulary():
    """Compiled (not run): peak temporaries at hidden [1, 4096, 512] bf16 x 128,256."""
    vocab, length, d_model = 128256, 4096, 512
    number_tokens = NumberTokens.from_pieces(["<pad>", "</s>"] + [str(d) for d in range(10)] + ["w"] * (vocab - 12))
    shapes = (
        jax.ShapeDtypeStruct((1, length, d_model), jnp.bfloat16),
        jax.ShapeDtypeStruct((d_model, vocab), jnp.bfloat16),
    )
    targets = jnp.zeros((1, length), jnp.int32)
    options = dict(z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")

    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, number_tokens, **options)[0]

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, number_tokens, **options)[0]

    unfused_bytes = _compiled_value_and_grad(unfused, *shapes).memory_analysis().temp_size_in_bytes
    compiled = _compiled_value_and_grad(fused, *shapes)
    fused_bytes = compiled.memory_analysis().temp_size_in_bytes
    assert unfused_bytes >= 5 * fused_bytes, (unfused_bytes, fused_bytes)
    # No [length, vocab] array of any dtype is formed.
    assert not re.search(rf"\[(1,)?{length},{vocab}\]", compiled.as_text())


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from ntl_jax import NumberTokens, fused_cross_entropy_and_ntl
    assert jax.device_count() == 8, jax.devices()
    pieces = ["<pad>", "</s>"] + [str(d) for d in range(10)] + [f"w{i}" for i in range(116)]
    nt = NumberTokens.from_pieces(pieces)
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(8, 6, 16)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(16, 128)), jnp.float32)
    targets = jnp.asarray(rng.choice(np.r_[2:12, 20, 30], size=(8, 6)), jnp.int32)
    def loss(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, nt, number_loss="number_level(reweigh=true)",
                                           loss_normalizing_factor="NUM_REAL_TARGET_TOKENS", chunk_size=48)[0]
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    reference = f(hidden, kernel)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharded = f(jax.device_put(hidden, NamedSharding(mesh, P("d", None, None))),
                jax.device_put(kernel, NamedSharding(mesh, P(None, "d"))))
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(sharded)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 2e-5 * np.max(np.abs(a)), (a, b)
    print("sharded equals unsharded")
    """
)


def run_on_eight_cpu_devices(script: str, timeout: int = 300) -> str:
    """The stdout of `script` run in a process with 8 host CPU devices (it must succeed)."""
    env = {**os.environ, "XLA_FLAGS": xla_flags.host_devices(8), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_sharded_on_batch_and_vocabulary_equals_unsharded():
    assert "sharded equals unsharded" in run_on_eight_cpu_devices(SHARDED)


def test_no_module_level_state_decides_how_the_head_computes():
    # The chip, the chunk, the backward and Pallas' interpret mode are one static
    # argument (`FusedPlan`), the formulation of the number statistics is named by the
    # number tokens: no module of the core holds a list or set read while tracing, and
    # none has a context manager to set one.
    import importlib
    import inspect
    import pkgutil

    from ntl_jax import _core
    from ntl_jax._core import fused, fused_plan, number_stats

    assert not any(hasattr(fused, name) for name in ("_compiling_for", "_pallas_interpreted", "compiling_for",
                                                      "pallas_interpreted"))
    assert not hasattr(number_stats, "_forced") and not hasattr(number_stats, "forced_formulation")
    for module in pkgutil.walk_packages(_core.__path__, "ntl_jax._core."):  # subpackages' modules too
        source = inspect.getsource(importlib.import_module(module.name))
        assert "contextmanager" not in source, module.name
        state = [name for name, value in vars(importlib.import_module(module.name)).items()
                 if isinstance(value, (list, set)) and name != "__path__"]  # a package's own path
        assert not state, (module.name, state)
    plan = fused_plan.plan((1, 8, 4), 300, device_kind="TPU v5 lite", backward="pallas_interpret")
    assert plan == fused_plan.FusedPlan("TPU v5 lite", 300, True, "pallas", True) and hash(plan) == hash(
        fused_plan.FusedPlan("TPU v5 lite", 300, True, "pallas", True))
    assert fused_plan.plan((1, 8, 4), 300, device_kind="cpu") == fused_plan.FusedPlan(None, 300, False)


def test_without_a_chip_named_the_plan_is_one_per_platform():
    # No chip named: a TPU's plan and the other backends', the platform the program is
    # lowered for picks one (nothing read from the devices of this process); Pallas'
    # kernels make a TPU-only program.
    from ntl_jax._core.fused_plan import ByPlatform, FusedPlan, plan

    assert plan((1, 8, 4), 300) == ByPlatform(tpu=FusedPlan("TPU", 300, True), other=FusedPlan(None, 300, False))
    assert plan((1, 8, 4), 300, backward="pallas") == ByPlatform(tpu=FusedPlan("TPU", 300, True, "pallas"), other=None)
    assert plan((1, 8, 4), 300, backward="pallas_interpret") == ByPlatform(
        tpu=FusedPlan("TPU", 300, True, "pallas", True), other=FusedPlan(None, 300, False, "pallas", True))
    # The TPU's chunk is a v5e's: 8,192 tokens at Qwen3's shape, and at Llama-3's.
    assert plan((1, 8192, 1024), 151936).tpu.chunk == plan((1, 8192, 1024), 151936, device_kind="TPU v5 lite").chunk
    assert plan((1, 8192, 4096), 128256).tpu.chunk == 16384 and plan((1, 8192, 4096), 128256).other.chunk == 1024
    assert len({plan((1, 8, 4), 300), plan((1, 8, 4), 300)}) == 1  # hashable: one program in jit's cache


@pytest.mark.parametrize("options", [dict(), dict(label_smoothing=0.1, number_loss="was(reweigh=true)")],
                         ids=["defaults", "smoothed_reweighed"])
def test_without_a_chip_named_the_cpu_program_is_the_cpus(options):
    # Lowered for this CPU, the head without `device_kind` (a plan per platform, both
    # traced) is the program named "cpu": the same loss and gradients bit for bit, and the
    # same cost by XLA's count.
    hidden, kernel, targets, weights = _inputs(seed=4)

    def loss(h, k, device_kind=None):
        return fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, chunk_size=7,
                                           device_kind=device_kind, **options)[0]

    step = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnames="device_kind")
    unnamed, named = step.lower(hidden, kernel).compile(), step.lower(hidden, kernel, device_kind="cpu").compile()
    for a, b in zip(jax.tree.leaves(unnamed(hidden, kernel)), jax.tree.leaves(named(hidden, kernel))):
        np.testing.assert_array_equal(a, b)
    for key in ("flops", "bytes accessed"):
        assert unnamed.cost_analysis()[key] == named.cost_analysis()[key], key
    reference = _both(hidden, kernel, targets, weights=weights, **options)[0]
    _assert_close(reference[0], unnamed(hidden, kernel)[0], what="loss")
    _assert_close(reference[2][1], unnamed(hidden, kernel)[1][1], what="d kernel")


def test_the_top_token_is_the_argmax_of_the_logits():
    from ntl_jax._core import fused_plan, pipeline
    from ntl_jax._core.fused import head_stats_from_hidden
    from ntl_jax._core.options import Options
    from ntl_jax._core.targets import number_target

    hidden, kernel, targets, weights = _inputs(seed=8)
    keep = weights > 0
    options = Options(number_loss="none")
    assert options.number_loss is None
    for chunk_size in (7, 69):
        target = number_target(targets, weights, kernel.shape[1], NT, gce_sigma=options.cross_entropy.gce_sigma)
        reads = pipeline.reads(options.number_loss, with_value=True)
        plan = fused_plan.plan(hidden.shape, kernel.shape[1], chunk_size=chunk_size)
        _, top = head_stats_from_hidden(hidden, kernel, target, NT, reads, plan,
                                        label_smoothing=options.cross_entropy.label_smoothing, with_top=True)
        np.testing.assert_array_equal(target.ids, jnp.where(keep, targets, -1))
        logits = jnp.einsum("bld,dv->blv", jnp.where(keep[..., None], hidden, 0.0), kernel)
        np.testing.assert_array_equal(top, jnp.argmax(logits, axis=-1))
