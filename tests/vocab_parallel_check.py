"""Run as a script on 8 host CPU devices: the vocabulary-parallel fused head
(`fused_cross_entropy_and_ntl(..., vocab_axis=...)`) against the one-device function.

`tests/test_vocab_parallel.py` starts it in a subprocess (the device count is fixed when
JAX initialises) and checks what it prints: one JSON object per line.
"""

import json
import os
import re
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ntl_jax import NumberTokens, fused_cross_entropy_and_ntl, losses  # noqa: E402
from ntl_jax._core import fused_plan, pipeline  # noqa: E402
from ntl_jax._core.fused import head_stats_from_hidden  # noqa: E402
from ntl_jax._core.options import Options  # noqa: E402
from ntl_jax._core.targets import number_target  # noqa: E402
from ntl_jax._core.vocab_parallel import vocab_shards  # noqa: E402
from tests.grid import long_run  # noqa: E402
from tests.objective_options import FACTORS, OPTIONS  # noqa: E402

# 128 ids; the digits sit in every quarter (and every half) of the vocabulary, "." too.
VOCAB = 128
DIGIT_IDS = [3, 17, 30, 37, 50, 66, 80, 95, 101, 127]
PIECES = [f"w{i}" for i in range(VOCAB)]
for digit, i in enumerate(DIGIT_IDS):
    PIECES[i] = str(digit)
PIECES[0], PIECES[1], PIECES[64] = "<pad>", "</s>", "."
NT = NumberTokens.from_pieces(PIECES)
B, L, D = 8, 12, 16
CHUNK = 12  # does not divide a shard's 32 or 64 columns: the moved-back last chunk is exercised


def inputs(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(B, L, D)), dtype)
    kernel = jnp.asarray(rng.normal(size=(D, VOCAB)), dtype)
    # Mostly digits in runs (numbers), words from every shard, padding at the end.
    targets = rng.choice(np.r_[DIGIT_IDS, DIGIT_IDS, [2, 20, 64, 70, 100, 126]], size=(B, L)).astype(np.int32)
    targets[:, -2:] = 0
    weights = (rng.random((B, L)) > 0.15).astype(np.float32) * (targets != 0)
    segments = np.array([[1] * 5 + [2] * 5 + [0] * 2] * B)
    positions = np.array([list(range(5)) + list(range(5)) + [0, 0]] * B)
    packed = {"decoder_segment_ids": jnp.asarray(segments), "decoder_positions": jnp.asarray(positions)}
    return hidden, kernel, jnp.asarray(targets), jnp.asarray(weights), packed


def mesh_of(data, model):
    return Mesh(np.array(jax.devices()[: data * model]).reshape(data, model), ("data", "model"))


def value_and_grads(mesh, hidden, kernel, targets, weights, chunk_size=CHUNK, sequence_parallel=False,
                    compiled=None, **options):
    """Loss, parts and both gradients; vocabulary-parallel over `mesh` when given, with
    the hidden states' sequence split over `model` too with `sequence_parallel`.
    `compiled`: a list to append the compiled program's HLO text to."""
    parallel = dict(vocab_axis="model", mesh=mesh, sequence_parallel=sequence_parallel) if mesh else {}

    def loss(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, chunk_size=chunk_size, **parallel,
                                           **options)

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    if mesh is not None:
        hidden = jax.device_put(hidden, NamedSharding(mesh, P("data", "model" if sequence_parallel else None)))
        kernel = jax.device_put(kernel, NamedSharding(mesh, P(None, "model")))
    if compiled is not None:
        compiled.append(f.lower(hidden, kernel).compile().as_text())
    (value, parts), grads = f(hidden, kernel)
    return {"loss": value, **parts, "d_hidden": grads[0], "d_kernel": grads[1]}


def worst_relative_error(want, got):
    """max over entries of |want - got| / max |want|, the worst over every output."""
    worst = 0.0
    for name in want:
        a, b = np.asarray(want[name], np.float64), np.asarray(got[name], np.float64)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30)))
    return worst


def all_gathers(hlo_text):
    """`[(dtype, shape)]` of every all-gather in compiled HLO text."""
    return [(m.group(1), [int(x) for x in m.group(2).split(",") if x])
            for m in re.finditer(r"= (\w+)\[([\d,]*)\][^=\n]*? all-gather(?:-start)?\(", hlo_text)]


def report(**fields):
    print(json.dumps(fields), flush=True)


# These option sets run over 8 shards (of 16 columns each) and over 2, every one over 4;
# with pytest --long every one over 2 as well.
A_FEW = ("was-reweigh", "number_level_float-reweigh", "smoothing-z")


def check_equal_to_one_device():
    hidden, kernel, targets, weights, packed = inputs()
    every_count = long_run()
    one_device, one_chunk = {}, {}
    for shards in (2, 4, 8):
        mesh = mesh_of(8 // shards, shards)
        for name, options in OPTIONS.items():
            if name not in A_FEW and (shards == 8 or (shards == 2 and not every_count)):
                continue
            if name not in one_device:
                one_device[name] = value_and_grads(None, hidden, kernel, targets, weights, **options)
            want = one_device[name]
            got = value_and_grads(mesh, hidden, kernel, targets, weights, **options)
            report(check="variant", shards=shards, name=name, error=worst_relative_error(want, got))
        # Each factor packed or not in turn (pytest --long: both).
        for i, factor in enumerate(FACTORS if shards == 4 else ()):
            for segments in ({}, packed) if every_count else (packed if i % 2 else {},):
                options = dict(loss_normalizing_factor=factor, number_loss=losses.was(reweigh=True), **segments)
                want = value_and_grads(None, hidden, kernel, targets, weights, **options)
                got = value_and_grads(mesh, hidden, kernel, targets, weights, **options)
                report(check="factor", shards=shards, name=f"{factor} {'packed' if segments else 'unpacked'}",
                       error=worst_relative_error(want, got))
        # The default chunk, and a chunk wider than a shard.
        for chunk_size in (None, 1000):
            if chunk_size not in one_chunk:
                one_chunk[chunk_size] = value_and_grads(None, hidden, kernel, targets, weights, chunk_size=chunk_size)
            want = one_chunk[chunk_size]
            got = value_and_grads(mesh, hidden, kernel, targets, weights, chunk_size=chunk_size)
            report(check="chunk", shards=shards, name=str(chunk_size), error=worst_relative_error(want, got))


# Option sets the sequence-parallel head runs through (each over 2 x 4 and 4 x 2).
SEQUENCE_OPTIONS = ("was-reweigh", "number_level", "smoothing-z", "was_cdf-gce")


def check_sequence_parallel():
    """The hidden states' sequence split over `model` as well: the same loss and
    gradients, the hidden states' gradient split the same way, and nothing gathered but
    the hidden states (no kernel columns)."""
    hidden, kernel, targets, weights, _ = inputs(seed=5)
    for data, model in ((2, 4), (4, 2)):
        mesh = mesh_of(data, model)
        for name in SEQUENCE_OPTIONS:
            want = value_and_grads(None, hidden, kernel, targets, weights, **OPTIONS[name])
            hlo = []
            got = value_and_grads(mesh, hidden, kernel, targets, weights, sequence_parallel=True, compiled=hlo,
                                  **OPTIONS[name])
            gathered = [shape for _, shape in all_gathers(hlo[0]) if D in shape]
            report(check="sequence", shards=model, name=name, error=worst_relative_error(want, got),
                   d_hidden_spec=[str(axis) for axis in got["d_hidden"].sharding.spec],
                   gathered_with_d_model=gathered)
    hidden, kernel, targets, weights, _ = inputs(seed=6, dtype=jnp.bfloat16)
    want = value_and_grads(None, hidden, kernel, targets, weights)
    got = value_and_grads(mesh_of(2, 4), hidden, kernel, targets, weights, sequence_parallel=True)
    report(check="sequence bfloat16", error=worst_relative_error({"loss": want["loss"]}, {"loss": got["loss"]}),
           grad_error=worst_relative_error({k: want[k] for k in ("d_hidden", "d_kernel")},
                                           {k: got[k] for k in ("d_hidden", "d_kernel")}),
           dtypes=[str(got["d_hidden"].dtype), str(got["d_kernel"].dtype)])


def check_bfloat16_and_the_argmax():
    hidden, kernel, targets, weights, _ = inputs(seed=1, dtype=jnp.bfloat16)
    mesh = mesh_of(2, 4)
    want = value_and_grads(None, hidden, kernel, targets, weights)
    got = value_and_grads(mesh, hidden, kernel, targets, weights)
    report(check="bfloat16", error=worst_relative_error({"loss": want["loss"]}, {"loss": got["loss"]}),
           grad_error=worst_relative_error({k: want[k] for k in ("d_hidden", "d_kernel")},
                                           {k: got[k] for k in ("d_hidden", "d_kernel")}),
           dtypes=[str(got["d_hidden"].dtype), str(got["d_kernel"].dtype)])
    hidden, kernel, targets, weights, _ = inputs(seed=2)
    # Ties across shards: two columns in different shards with the same logits.
    kernel = kernel.at[:, 90].set(kernel[:, 10])

    def top(shards):
        options = Options(number_loss=None)
        target = number_target(targets, weights, VOCAB, NT, gce_sigma=options.cross_entropy.gce_sigma)
        plan = fused_plan.plan(hidden.shape, VOCAB, shards, chunk_size=CHUNK)
        return head_stats_from_hidden(hidden, kernel, target, NT, pipeline.reads(options.number_loss, with_value=True),
                                      plan, label_smoothing=options.cross_entropy.label_smoothing, with_top=True,
                                      shards=shards)[1]

    sharded = jax.jit(lambda: top(vocab_shards("model", mesh, VOCAB, B)))()
    logits = jnp.einsum("bld,dv->blv", jnp.where((weights > 0)[..., None], hidden, 0.0), kernel)
    report(check="argmax", equal=bool(np.array_equal(sharded, jnp.argmax(logits, axis=-1))))


def check_mesh_in_context():
    hidden, kernel, targets, weights, _ = inputs(seed=3)
    mesh = mesh_of(2, 4)
    want = value_and_grads(None, hidden, kernel, targets, weights)

    def loss(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, chunk_size=CHUNK, vocab_axis="model")[0]

    # Each context is made only when entered: jax.set_mesh sets the mesh when called.
    for name, context in (("with mesh", lambda: mesh), ("jax.set_mesh", lambda: jax.set_mesh(mesh))):
        with context():
            value = jax.jit(loss)(hidden, kernel)
        report(check="context", name=name, error=worst_relative_error({"loss": want["loss"]}, {"loss": value}))


def check_errors():
    hidden, kernel, targets, weights, _ = inputs(seed=4)
    cases = {
        "indivisible": dict(kernel=jnp.zeros((D, 130)), mesh=mesh_of(2, 4), vocab_axis="model"),
        "unknown axis": dict(mesh=mesh_of(2, 4), vocab_axis="vocab"),
        "no mesh": dict(vocab_axis="model"),
        "mesh without axis": dict(mesh=mesh_of(2, 4)),
        "indivisible batch": dict(hidden=hidden[:3], targets=targets[:3], mesh=mesh_of(2, 4), vocab_axis="model"),
        "indivisible sequence": dict(mesh=mesh_of(1, 8), vocab_axis="model", sequence_parallel=True),
        "sequence without axis": dict(sequence_parallel=True),
        "sequence not a bool": dict(mesh=mesh_of(2, 4), vocab_axis="model", sequence_parallel="yes"),
    }
    for name, change in cases.items():
        args = dict(hidden=hidden, kernel=kernel, targets=targets)
        args.update({k: v for k, v in change.items() if k in args})
        options = {k: v for k, v in change.items() if k not in args}
        try:
            fused_cross_entropy_and_ntl(args["hidden"], args["kernel"], args["targets"], NT, **options)
            report(check="error", name=name, message=None)
        except (ValueError, TypeError) as error:
            report(check="error", name=name, message=str(error))


def check_compiled_at_scale():
    """Compiled, not run: the issue's shapes, hidden [8, 1024, 512] bf16 on `data`,
    kernel [512, 128256] bf16 on `model`, mesh data 2 x model 4."""
    vocab, d_model = 128256, 512
    number_tokens = NumberTokens.from_pieces(["<pad>", "</s>", "<unk>"] + [str(d) for d in range(10)]
                                             + [f"w{i}" for i in range(vocab - 13)])
    targets = jnp.zeros((8, 1024), jnp.int32)
    mesh = mesh_of(2, 4)

    def compiled(sharded, vocab_axis):
        def loss(h, k):
            return fused_cross_entropy_and_ntl(h, k, targets, number_tokens, z_loss=1e-4,
                                               loss_normalizing_factor="NUM_REAL_TARGET_TOKENS",
                                               vocab_axis=vocab_axis, mesh=mesh if vocab_axis else None)[0]

        specs = [jax.ShapeDtypeStruct((8, 1024, d_model), jnp.bfloat16),
                 jax.ShapeDtypeStruct((d_model, vocab), jnp.bfloat16)]
        if sharded:
            specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))
                     for s, spec in zip(specs, (P("data"), P(None, "model")))]
        c = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*specs).compile()
        gathered = [int(np.prod(shape)) for _, shape in all_gathers(c.as_text())]
        with_d_model = [n for (_, shape), n in zip(all_gathers(c.as_text()), gathered) if d_model in shape]
        return {"temp_bytes": c.memory_analysis().temp_size_in_bytes, "gathered_elements": sum(gathered),
                "gathered_with_d_model": sum(with_d_model)}

    report(check="scale", one_device=compiled(False, None), automatic=compiled(True, None),
           vocab_parallel=compiled(True, "model"))


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    for check in sys.argv[1:] or ["equal", "sequence", "bfloat16", "context", "errors", "scale"]:
        {"equal": check_equal_to_one_device, "sequence": check_sequence_parallel,
         "bfloat16": check_bfloat16_and_the_argmax,
         "context": check_mesh_in_context, "errors": check_errors, "scale": check_compiled_at_scale}[check]()
