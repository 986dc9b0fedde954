"""The NTL T5X models with `fused_loss=True`, without T5X: the network runs without its
logits projection and the loss streams `hidden @ kernel`. Against the same fake model
with `fused_loss=False`: loss, gradients and every metric.

Vocabulary-parallel (`vocab_axis`, the mixin's `fused_vocab_axis`) on a 2 x 4 mesh of 8
host CPU devices: this module run as a script (`python -m tests.test_t5x_fused_loss`, in
a subprocess, since the device count is fixed when JAX initialises) prints one JSON
line per check, which `test_vocab_parallel_*` read.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import losses
from ntl_jax._core.options import Options
from ntl_jax.t5x import _loss as t5x_loss
from tests import xla_flags
from tests.objective_options import as_options
from tests.test_t5x_model_loss import (
    FACTORS,
    NT,
    WIDTH,
    FakeNTLModel,
    FakeVocabulary,
    make_batch,
    value,
)

D_MODEL = 8


class TinyDecoder(nn.Module):
    """A stand-in network with T5.1.1's head: a `logits_dense` projection (or, tied, the
    embedding's `attend` with T5's 1/sqrt(d) scaling)."""

    tied: bool = False

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(WIDTH, D_MODEL, name="token_embedder")
        y = nn.tanh(nn.Dense(D_MODEL, name="body")(embed(tokens)))
        if self.tied:
            return embed.attend(y) / jnp.sqrt(D_MODEL)
        return nn.DenseGeneral(WIDTH, use_bias=False, name="logits_dense")(y)


class FlaxFakeModel(FakeNTLModel):
    """The fake T5X model whose `_compute_logits` runs a Flax network, as T5X's does."""

    def __init__(self, *, module, **kwargs):
        super().__init__(vocabulary=FakeVocabulary(), **kwargs)
        self.module = module

    def _compute_logits(self, params, batch, dropout_rng=None):
        return self.module.apply({"params": params}, batch["decoder_input_tokens"])


def _params(module, batch):
    params = module.init(jax.random.key(0), batch["decoder_input_tokens"])["params"]
    # Larger logits than the initialisation gives, so the loss is not near-uniform.
    return jax.tree.map(lambda p: p * 3.0, params)


def _loss_and_grads(model, params, batch):
    (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
    return loss, metrics, grads


@pytest.mark.parametrize("tied", [False, True], ids=["logits_dense", "tied"])
@pytest.mark.parametrize("factor", FACTORS, ids=str)
def test_fused_model_equals_the_unfused_model(tied, factor):
    batch = make_batch(packed=True, seed=3)
    module = TinyDecoder(tied=tied)
    params = _params(module, batch)
    options = dict(module=module, loss_normalizing_factor=factor, label_smoothing=0.1, z_loss=1e-3)
    number_loss = losses.number_level(reweigh=True)
    unfused = FlaxFakeModel(**options, number_loss=number_loss)
    fused = FlaxFakeModel(**options, number_loss=number_loss, fused_loss=True, fused_chunk_size=5)
    loss_u, metrics_u, grads_u = _loss_and_grads(unfused, params, batch)
    loss_f, metrics_f, grads_f = _loss_and_grads(fused, params, batch)
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5)
    assert metrics_f.keys() == metrics_u.keys()
    for name in metrics_u:
        np.testing.assert_allclose(value(metrics_f[name]), value(metrics_u[name]), rtol=2e-5, atol=1e-7,
                                   err_msg=name)
    for path, g_u in jax.tree_util.tree_flatten_with_path(grads_u)[0]:
        g_f = params_at(grads_f, path)
        scale = float(np.max(np.abs(g_u))) + 1e-30
        assert float(np.max(np.abs(g_f - g_u))) <= 2e-5 * scale, jax.tree_util.keystr(path)


def params_at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def test_accuracy_stand_ins_score_the_vocabulary_argmax():
    batch = make_batch(packed=False, seed=4)
    module = TinyDecoder()
    params = _params(module, batch)
    model = FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=7)
    model.loss_fn(params, batch, None)
    call = model.metric_calls[-1]
    logits = module.apply({"params": params}, batch["decoder_input_tokens"])
    correct = np.asarray(jnp.argmax(logits, -1) == batch["decoder_target_tokens"])
    assert call["logits"].shape == batch["decoder_target_tokens"].shape + (2,)
    # Where the mask counts (ignored positions' hidden states are zeroed, as the loss
    # sees them, and the stock metric masks them out).
    counted = np.asarray(call["mask"]) > 0
    assert counted.sum() > 10 and correct[counted].any() and not correct[counted].all()
    got = np.asarray(jnp.argmax(call["logits"], -1) == call["targets"])
    np.testing.assert_array_equal(got[counted], correct[counted])


def test_the_fused_model_never_forms_the_logits():
    batch = make_batch(packed=True, seed=5)
    module = TinyDecoder()
    params = _params(module, batch)
    model = FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=5)
    hlo = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
    assert f"[3,10,{WIDTH}]" not in hlo and f"[30,{WIDTH}]" not in hlo
    unfused = FlaxFakeModel(module=module)
    hlo = jax.jit(jax.grad(lambda p: unfused.loss_fn(p, batch, None)[0])).lower(params).compile().as_text()
    assert f"[3,10,{WIDTH}]" in hlo  # the check can fail


@pytest.mark.parametrize("kwargs, message", [
    (dict(fused_loss="yes"), "expected fused_loss True, False or 'auto'"),
    (dict(fused_chunk_size=0), "fused_chunk_size None or a positive int"),
    (dict(fused_vocab_axis=1), "fused_vocab_axis None or the name of a mesh axis"),
    (dict(fused_vocab_axis=("model",)), "fused_vocab_axis None or the name of a mesh axis"),
    (dict(fused_vocab_axis=""), "fused_vocab_axis None or the name of a mesh axis"),
    (dict(fused_device_kind=5), "fused_device_kind None or a jax.Device.device_kind"),
])
def test_bad_fused_options(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        FlaxFakeModel(module=TinyDecoder(), **kwargs)


def test_the_fused_loss_is_traced_for_the_chip_it_is_compiled_for():
    # What compile_check does with a pod's chip (`compiled_for`): the copy's fused loss
    # is the TPU's, which gathers no column of the kernel (picked in its chunk loop);
    # the model's own, for a CPU, gathers them. The model itself is unchanged.
    batch = make_batch(packed=False, seed=6)
    module = TinyDecoder()
    params = _params(module, batch)
    model = FlaxFakeModel(module=module, fused_loss=True, fused_device_kind="cpu")
    tpu = model.compiled_for("TPU v5 lite")
    assert (model.fused_device_kind, tpu.fused_device_kind) == ("cpu", "TPU v5 lite")

    def kernel_gathers(m):
        text = jax.jit(jax.grad(lambda p: m.loss_fn(p, batch, None)[0])).lower(params).as_text()
        kernel = f"}}> : (tensor<{D_MODEL}x{WIDTH}xf32>"
        return [line for line in text.splitlines() if '"stablehlo.gather"' in line and kernel in line]

    assert kernel_gathers(model) and not kernel_gathers(tpu)


def test_model_loss_from_hidden_equals_model_loss():
    batch = make_batch(packed=True, seed=6)
    rng = np.random.default_rng(6)
    hidden = jnp.asarray(rng.normal(size=(3, 10, D_MODEL)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(D_MODEL, WIDTH)), jnp.float32)
    for factor in FACTORS:
        options = Options(number_loss=losses.was(reweigh=True))
        want = t5x_loss.model_loss(hidden @ kernel, batch, NT, options, loss_normalizing_factor=factor)
        got = t5x_loss.model_loss_from_hidden(hidden, kernel, batch, NT, options,
                                              loss_normalizing_factor=factor, chunk_size=7)
        np.testing.assert_allclose(got.loss, want.loss, rtol=2e-5)
        np.testing.assert_allclose(got.mask, want.mask)
        assert got.averages.keys() == want.averages.keys() and got.per_step.keys() == want.per_step.keys()
        for name, (total, count) in want.averages.items():
            np.testing.assert_allclose(got.averages[name][0], total, rtol=2e-5, atol=1e-7, err_msg=name)
            np.testing.assert_allclose(got.averages[name][1], count, err_msg=name)
        for name, total in want.per_step.items():
            np.testing.assert_allclose(got.per_step[name], total, rtol=2e-5, atol=1e-7, err_msg=name)


@pytest.mark.filterwarnings("ignore:.*with mesh.*:DeprecationWarning")  # as T5X's partitioner runs the step
def test_no_usable_mesh_computes_as_on_one_device():
    """No mesh, a one-device mesh or `fused_vocab_axis=None`: the loss as without a mesh."""
    from jax.sharding import Mesh

    assert t5x_loss.context_vocab_axis("model") is None
    one_device = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with one_device:
        assert t5x_loss.context_vocab_axis("model") is None
        assert t5x_loss.context_vocab_axis(None) is None
    batch = make_batch(packed=True, seed=7)
    module = TinyDecoder()
    params = _params(module, batch)

    def step(model):
        return jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(params, batch, None)

    want = step(FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=5))
    with one_device:
        got = step(FlaxFakeModel(module=module, fused_loss=True, fused_chunk_size=5, fused_vocab_axis="model"))
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(a, b), got, want))


# -- vocabulary-parallel on 8 host CPU devices (a subprocess) ---------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
# As tests/test_vocab_parallel.py: sums per shard, then across shards, in float32.
RTOL = 2e-5


@pytest.fixture(scope="module")
def vocab_parallel():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=xla_flags.host_devices(8))
    run = subprocess.run([sys.executable, "-m", "tests.test_t5x_fused_loss"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    by_check = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            by_check.setdefault(row.pop("check"), []).append(row)
    return by_check


def test_vocab_parallel_model_loss_from_hidden_equals_the_unsharded_one(vocab_parallel):
    rows = vocab_parallel["model_loss_from_hidden"]
    assert len(rows) == 1
    for row in rows:
        # The loss, every metric input and both gradients were compared.
        assert {f"['{name}']" for name in ("loss", "z_loss", "mask", "d_hidden", "d_kernel")} <= set(row["errors"]), row
        assert any("number_abs_error" in name for name in row["errors"]), row
        assert any("accuracy_inputs" in name for name in row["errors"]), row
        assert max(row["errors"].values()) <= RTOL, row


def test_vocab_parallel_mixin_under_the_mesh_in_context(vocab_parallel):
    rows = {row["name"]: row for row in vocab_parallel["mixin"]}
    assert set(rows) == {"fused_vocab_axis=model", "fused_vocab_axis=None", "data-parallel 2 x 1"}
    for row in rows.values():
        assert any("logits_dense" in name for name in row["errors"]), row
        assert any("number_abs_error" in name for name in row["errors"]), row
        assert max(row["errors"].values()) <= RTOL, row
    axes = {row["name"]: row["axis"] for row in vocab_parallel["context_vocab_axis"]}
    # 8 x 1: the batch split over 8 devices under shard_map, the kernel whole on each.
    assert axes == {"no mesh": None, "2 x 4": "model", "2 x 4 set_mesh": "model", "8 x 1": "model",
                    "no model axis": None, "None": None}


def test_vocab_parallel_mixin_gathers_no_kernel(vocab_parallel):
    rows = {row["name"]: row for row in vocab_parallel["gathers"]}
    assert rows["fused_vocab_axis=None"]["kernel_gathers"], rows  # left to XLA it gathers: the check can fail
    assert rows["fused_vocab_axis=model"]["kernel_gathers"] == [], rows


# The script's side: run in the subprocess above.


def _worst_errors(want, got):
    """`{leaf path: max |want - got| / max |want|}` over the leaves of two pytrees."""
    errors = {}
    got_leaves = dict(jax.tree_util.tree_flatten_with_path(got)[0])
    for path, a in jax.tree_util.tree_flatten_with_path(want)[0]:
        a, b = np.asarray(a, np.float64), np.asarray(got_leaves[path], np.float64)
        assert a.shape == b.shape, (jax.tree_util.keystr(path), a.shape, b.shape)
        errors[jax.tree_util.keystr(path)] = float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(a)), 1e-30))
    return errors


def _kernel_gathers(hlo_text):
    """The shapes of the all-gathers in compiled HLO that hold a `[D_MODEL, WIDTH]` kernel slice."""
    shapes = [[int(x) for x in m.group(1).split(",") if x]
              for m in re.finditer(r"= \w+\[([\d,]*)\][^=\n]*? all-gather(?:-start)?\(", hlo_text)]
    return [shape for shape in shapes if D_MODEL in shape and WIDTH in shape]


def _report(**fields):
    print(json.dumps(fields), flush=True)


def _vocab_parallel_checks():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() == 8, jax.devices()
    devices = np.array(jax.devices())
    mesh = Mesh(devices.reshape(2, 4), ("data", "model"))
    # Six sequences (two packed batches): the data axis splits them.
    one, two = make_batch(packed=True, seed=8), make_batch(packed=True, seed=9)
    batch = {k: jnp.concatenate([one[k], two[k]]) for k in one}
    rng = np.random.default_rng(8)
    hidden = jnp.asarray(rng.normal(size=(6, 10, D_MODEL)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(D_MODEL, WIDTH)), jnp.float32)
    on_mesh = dict(hidden=NamedSharding(mesh, P("data")), kernel=NamedSharding(mesh, P(None, "model")))

    # model_loss_from_hidden: 6 columns per shard, in chunks of 4 (the last one moved back).
    # (Every variant, factor and chunk size: tests/test_vocab_parallel.py.)
    cases = {
        "was reweigh smoothing z AVERAGE_PER_SEQUENCE": (
            as_options(number_loss=losses.was(reweigh=True), label_smoothing=0.1, z_loss=1e-3),
            dict(loss_normalizing_factor="AVERAGE_PER_SEQUENCE", chunk_size=4)),
    }
    for name, (options, arguments) in cases.items():
        def run(vocab_axis, options=options, arguments=arguments):
            def loss(h, k):
                out = t5x_loss.model_loss_from_hidden(h, k, batch, NT, options, vocab_axis=vocab_axis, **arguments)
                return out.loss, out._replace(segment_ids={})

            f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
            if vocab_axis is None:
                (_, out), (d_hidden, d_kernel) = f(hidden, kernel)
            else:
                with mesh:
                    (_, out), (d_hidden, d_kernel) = f(jax.device_put(hidden, on_mesh["hidden"]),
                                                       jax.device_put(kernel, on_mesh["kernel"]))
            return {**out._asdict(), "d_hidden": d_hidden, "d_kernel": d_kernel}

        _report(check="model_loss_from_hidden", name=name, errors=_worst_errors(run(None), run("model")))

    # The mixin's decision: the mesh in context. (`jax.set_mesh(mesh)` sets the mesh
    # when called, so each context is made only when entered.)
    for name, context, vocab_axis in (
        ("no mesh", None, "model"), ("2 x 4", lambda: mesh, "model"),
        ("2 x 4 set_mesh", lambda: jax.set_mesh(mesh), "model"),
        ("8 x 1", lambda: Mesh(devices.reshape(8, 1), ("data", "model")), "model"),
        ("no model axis", lambda: Mesh(devices.reshape(2, 4), ("data", "vocab")), "model"),
        ("None", lambda: mesh, None),
    ):
        if context is None:
            axis = t5x_loss.context_vocab_axis(vocab_axis)
        else:
            with context():
                axis = t5x_loss.context_vocab_axis(vocab_axis)
        _report(check="context_vocab_axis", name=name, axis=axis)

    # The mixin's step under `with mesh:`, as T5X's partitioner runs it, against one device;
    # and what the compiled step gathers.
    module = TinyDecoder()
    params = _params(module, batch)
    params_on_mesh = jax.tree_util.tree_map_with_path(
        lambda path, p: jax.device_put(p, NamedSharding(
            mesh, P(None, "model") if "logits_dense" in jax.tree_util.keystr(path) else P())), params)
    batch_on_mesh = {k: jax.device_put(v, NamedSharding(mesh, P("data"))) for k, v in batch.items()}
    options = dict(module=module, fused_loss=True, fused_chunk_size=4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS",
                   number_loss=losses.was(reweigh=True))

    def step(model):
        return jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))

    (loss, metrics), grads = step(FlaxFakeModel(**options))(params, batch, None)
    want = {"loss": loss, "metrics": metrics, "grads": grads}
    for vocab_axis in ("model", None):
        with mesh:
            compiled = step(FlaxFakeModel(**options, fused_vocab_axis=vocab_axis)).lower(
                params_on_mesh, batch_on_mesh, None).compile()
            (loss, metrics), grads = compiled(params_on_mesh, batch_on_mesh, None)
        name = f"fused_vocab_axis={vocab_axis}"
        got = {"loss": loss, "metrics": metrics, "grads": grads}
        _report(check="mixin", name=name, errors=_worst_errors(want, got))
        _report(check="gathers", name=name, kernel_gathers=_kernel_gathers(compiled.as_text()))
    # Data-parallel (one device on the model axis): the batch split under shard_map.
    data_parallel = Mesh(devices[:2].reshape(2, 1), ("data", "model"))
    with data_parallel:
        put = {k: jax.device_put(v, NamedSharding(data_parallel, P("data"))) for k, v in batch.items()}
        (loss, metrics), grads = step(FlaxFakeModel(**options))(params, put, None)
    _report(check="mixin", name="data-parallel 2 x 1", errors=_worst_errors(
        want, {"loss": loss, "metrics": metrics, "grads": grads}))


if __name__ == "__main__":
    _vocab_parallel_checks()


@pytest.mark.parametrize("length, fused", [(2, False), (10, True)])
def test_auto_fuses_where_each_device_holds_d_model_target_tokens(monkeypatch, length, fused):
    """`fused_loss="auto"` on one device: 3 x 2 = 6 target tokens, below d_model 8, take
    the logits; 3 x 10 = 30 fuse. Either way the loss is the logits path's."""
    batch = {name: value[:, :length] for name, value in make_batch(packed=False, seed=5).items()}
    module = TinyDecoder()
    params = _params(module, batch)
    calls = []
    streamed = t5x_loss.model_loss_from_hidden
    monkeypatch.setattr(t5x_loss, "model_loss_from_hidden", lambda *a, **k: calls.append(1) or streamed(*a, **k))
    expected, expected_metrics = FlaxFakeModel(module=module).loss_fn(params, batch, None)
    auto = FlaxFakeModel(module=module, fused_loss="auto", fused_chunk_size=5)
    assert auto.fused_loss == "auto"
    loss, metrics = auto.loss_fn(params, batch, None)
    assert len(calls) == int(fused)
    np.testing.assert_allclose(loss, expected, rtol=2e-5)
    for name in expected_metrics:
        np.testing.assert_allclose(value(metrics[name]), value(expected_metrics[name]), rtol=2e-5, atol=1e-7)


def test_the_rule_counts_the_target_tokens_of_each_data_shard():
    # A 4 x 2 mesh: the batch splits over 4 data shards, or over all 8 devices when no
    # axis is the model's.
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((4, 2), ("data", "model"))):
        assert t5x_loss.fused_head_pays((3, 10), D_MODEL, "model") is False  # 7.5 per shard
        assert t5x_loss.fused_head_pays((4, 8), D_MODEL, "model") is True  # 8
        assert t5x_loss.fused_head_pays((4, 8), D_MODEL, None) is False  # 4
        assert t5x_loss.fused_head_pays((8, 8), D_MODEL, None) is True
    assert t5x_loss.fused_head_pays((1, 8), D_MODEL, "model") is True  # no mesh: one device
