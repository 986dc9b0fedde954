"""The fused head for Flax NNX models: a small decoder-only model's fused CE + NTL and its
gradients against the logits path, a loss of one's own training the model, and the
projection found, skipped and restored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

import optax  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import losses  # noqa: E402
from ntl_jax.flax import _nnx  # noqa: E402
from tests.objective_options import SQUARED_DISTANCE, registered_loss

PIECES = ["<pad>", "</s>", "What", "is", "*", "?", "+", "=", "."] + list("0123456789") + ["10", "25", "100", "99"]
PIECES += [f"w{i}" for i in range(37 - len(PIECES))]  # 37: a vocabulary that is no power of two
NUMBERS = ntl_jax.NumberTokens.from_pieces(PIECES, digit_level=False)
VOCAB, D_MODEL, BATCH, LENGTH = len(PIECES), 16, 3, 8


def _squared_distance_mean(logits, targets, weights) -> float:
    """SQUARED_DISTANCE's mean over the counted number targets, written plainly:
    `sum_j softmax(z)_j (v_j - y)^2` over the number tokens' logits `z`."""
    logits, targets, weights = (np.asarray(a, np.float64) for a in (logits, targets, weights))
    ids, values = np.asarray(NUMBERS.ids), np.asarray(NUMBERS.number_values, np.float64)
    z = logits[..., ids]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    counted = np.isin(targets, ids) * weights
    value_of = dict(zip(ids.tolist(), values.tolist()))
    y = np.vectorize(lambda t: value_of.get(int(t), 0.0))(targets)
    per_position = np.sum(p * np.square(values - y[..., None]), axis=-1)
    return float(np.sum(per_position * counted) / np.sum(counted))


class Block(nnx.Module):
    def __init__(self, d, rngs):
        self.attn_norm = nnx.RMSNorm(d, rngs=rngs)
        # No attention biases: the keys' bias gets no gradient (softmax ignores a shift per query).
        self.attn = nnx.MultiHeadAttention(2, d, use_bias=False, decode=False, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 2 * d, rngs=rngs)  # a Linear with a bias that is not the head
        self.down = nnx.Linear(2 * d, d, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.attn_norm(x), mask=mask)
        return x + self.down(jax.nn.gelu(self.up(self.mlp_norm(x))))


class Decoder(nnx.Module):
    """Embedding, causal self-attention + MLP blocks, final norm, and a head: `untied`
    (`lm_head`, an nnx.Linear), `tied` (`embed.attend`, scaled by 1/sqrt(d) after it),
    or `remat` (`lm_head` called inside `nnx.remat`). `scale` multiplies the logits."""

    def __init__(self, *, head="untied", bias=False, layers=2, scale=1.0, head_dtype=None, seed=0):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Embed(VOCAB, D_MODEL, rngs=rngs)
        self.blocks = nnx.List([Block(D_MODEL, rngs) for _ in range(layers)])
        self.final_norm = nnx.RMSNorm(D_MODEL, rngs=rngs)
        self.head, self.scale = head, scale
        if head != "tied":
            self.lm_head = nnx.Linear(D_MODEL, VOCAB, use_bias=bias, dtype=head_dtype, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        x = self.final_norm(x)
        if self.head == "tied":
            return self.embed.attend(x) / np.sqrt(D_MODEL)
        if self.head == "remat":
            return nnx.remat(lambda head, x: head(x))(self.lm_head, x) * self.scale
        return self.lm_head(x) * self.scale


def _data(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
    # Mostly number tokens, so every NTL term is exercised; ids 9-18 are digits 0-9.
    targets = np.where(rng.random((BATCH, LENGTH)) < 0.7, rng.choice(NUMBERS.ids, size=(BATCH, LENGTH)),
                       rng.integers(2, VOCAB, size=(BATCH, LENGTH))).astype(np.int32)
    targets[:, -2:] = 0  # padding
    weights = (targets > 0).astype(np.float32)
    weights[0, 1] = 0.0  # an ignored number target
    assert np.isin(targets[weights > 0], NUMBERS.ids).sum() >= 8
    return jnp.asarray(tokens), jnp.asarray(targets), jnp.asarray(weights)


def _objective(number_loss):
    return dict(number_loss=number_loss, ntl_weight=0.3, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")


def _nnx_loss_fn(tokens, targets, weights, number_loss, fused, numbers=NUMBERS):
    def loss_fn(model):
        if fused:
            hidden, kernel = _nnx.hidden_states_and_kernel(model, tokens)
            return ntl_jax.fused_cross_entropy_and_ntl(hidden, kernel, targets, numbers, weights=weights,
                                                       **_objective(number_loss))
        return ntl_jax.cross_entropy_and_ntl(model(tokens), targets, numbers, weights=weights,
                                             **_objective(number_loss))

    return loss_fn


def _loss_and_grads(model, tokens, targets, weights, number_loss, fused, transform):
    loss_fn = _nnx_loss_fn(tokens, targets, weights, number_loss, fused)

    if transform == "nnx":
        (loss, parts), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(model)
        return loss, parts, nnx.state(grads, nnx.Param)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_of_params(params):
        return loss_fn(nnx.merge(graphdef, params, rest))

    (loss, parts), grads = jax.jit(jax.value_and_grad(loss_of_params, has_aux=True))(params)
    return loss, parts, grads


@pytest.mark.parametrize("head, bias, scale, number_loss, transform", [
    ("untied", False, 1.0, "was", "nnx"),
    ("untied", False, 1.0, "number_level", "jax"),
    ("untied", True, 0.5, "was", "jax"),  # the bias folded into the kernel, and the logits scaled after the head
    ("tied", False, 1.0, "was", "nnx"),
    ("tied", False, 1.0, "number_level", "jax"),
    ("remat", True, 1.0, "number_level", "nnx"),  # the head inside an nnx transform of the model
    ("untied", True, 1.0, SQUARED_DISTANCE, "nnx"),  # a loss of one's own
], ids=lambda v: v.name if isinstance(v, losses.NumberLoss) else None)
def test_fused_loss_and_gradients_equal_the_logits_path(head, bias, scale, number_loss, transform):
    model = Decoder(head=head, bias=bias, scale=scale)
    tokens, targets, weights = _data()
    loss_u, parts_u, grads_u = _loss_and_grads(model, tokens, targets, weights, number_loss, False, transform)
    loss_f, parts_f, grads_f = _loss_and_grads(model, tokens, targets, weights, number_loss, True, transform)
    assert float(parts_u["ntl"]) > 0.01 and float(parts_u["cross_entropy"]) > 1.0
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5, atol=1e-7)
    for name in ("cross_entropy", "ntl", "ntl_term"):
        np.testing.assert_allclose(parts_f[name], parts_u[name], rtol=2e-5, atol=1e-7, err_msg=name)
    flat_u, flat_f = (jax.tree_util.tree_flatten_with_path(g)[0] for g in (grads_u, grads_f))
    assert [p for p, _ in flat_u] == [p for p, _ in flat_f]
    names = {jax.tree_util.keystr(p) for p, _ in flat_u}
    assert any("lm_head" in n and "kernel" in n for n in names) or head == "tied"
    assert ("lm_head']['bias" in "".join(names)) == bias
    for path, g_u in flat_u:
        g_f = dict(flat_f)[path]
        scale_u = float(np.max(np.abs(g_u)))
        assert scale_u > 0, jax.tree_util.keystr(path)  # every parameter gets a gradient
        assert float(np.max(np.abs(g_f - g_u))) <= 1e-4 * scale_u, jax.tree_util.keystr(path)


@pytest.mark.parametrize("fused", [False, True])
def test_a_loss_of_ones_own_trains_an_nnx_model(fused):
    model = Decoder(head="tied", layers=1)
    tokens, targets, weights = _data()
    loss_fn = _nnx_loss_fn(tokens, targets, weights, SQUARED_DISTANCE, fused)
    # Its mean is the plain formula on the model's logits, and the objective adds 0.3 x it.
    _, parts = loss_fn(model)
    expected = _squared_distance_mean(model(tokens), targets, weights)
    assert expected > 1.0
    np.testing.assert_allclose(parts["ntl"], expected, rtol=1e-5)
    np.testing.assert_allclose(parts["ntl_term"], 0.3 * expected, rtol=1e-5)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        (loss, parts), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, parts["ntl"]

    seen = [step(model, optimizer) for _ in range(4)]
    seen.append(loss_fn(model))
    losses_seen = [float(loss) for loss, _ in seen]
    assert np.all(np.isfinite(losses_seen)) and all(b < a for a, b in zip(losses_seen, losses_seen[1:])), losses_seen
    assert float(seen[-1][1]["ntl"]) < float(seen[0][1])


@pytest.mark.parametrize("number_loss", ["ntil", "squared_gap"])
def test_ntil_and_a_registered_loss_train_an_nnx_model_fused_as_unfused(number_loss):
    registered_loss()
    digits = ntl_jax.NumberTokens.from_pieces(PIECES)  # NTIL reads single digits
    model = Decoder(head="tied", layers=1)
    tokens, targets, weights = _data()
    unfused, fused = (_nnx_loss_fn(tokens, targets, weights, number_loss, f, digits) for f in (False, True))
    (loss_u, parts_u), (loss_f, parts_f) = unfused(model), fused(model)
    assert float(parts_u["ntl"]) > 0
    np.testing.assert_allclose(loss_f, loss_u, rtol=2e-5)
    np.testing.assert_allclose(parts_f["ntl"], parts_u["ntl"], rtol=2e-5)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        (loss, parts), grads = nnx.value_and_grad(fused, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss

    seen = [float(step(model, optimizer)) for _ in range(4)] + [float(fused(model)[0])]
    assert np.all(np.isfinite(seen)) and seen[-1] < seen[0], seen


@pytest.mark.parametrize("head, bias", [("untied", False), ("untied", True), ("tied", False)])
def test_hidden_times_kernel_is_the_logits(head, bias):
    model = Decoder(head=head, bias=bias, scale=0.5, layers=1)
    tokens, _, _ = _data()
    hidden, kernel = _nnx.hidden_states_and_kernel(model, tokens)
    width = D_MODEL + bias
    assert hidden.shape == (BATCH, LENGTH, width) and kernel.shape == (width, VOCAB)
    if head == "tied":
        np.testing.assert_array_equal(kernel, model.embed.embedding[...].T)
    else:
        np.testing.assert_array_equal(kernel[:D_MODEL], model.lm_head.kernel[...])
        if bias:
            np.testing.assert_array_equal(kernel[D_MODEL], model.lm_head.bias[...])
            np.testing.assert_array_equal(hidden[..., D_MODEL], 0.5)  # the ones column, scaled as the logits are
    np.testing.assert_allclose(hidden @ kernel, model(tokens), rtol=1e-5, atol=1e-5)


def test_the_projection_dtype_is_respected():
    model = Decoder(head_dtype=jnp.bfloat16, layers=1)  # float32 parameters, bfloat16 head
    tokens, _, _ = _data()
    logits = model(tokens)
    hidden, kernel = _nnx.hidden_states_and_kernel(model, tokens)
    assert logits.dtype == hidden.dtype == kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(kernel, model.lm_head.kernel[...].astype(jnp.bfloat16))
    np.testing.assert_allclose(np.float32(hidden @ kernel), np.float32(logits), rtol=2e-2, atol=2e-2)
    # Without a dtype the head computes in its inputs' own: float32 here.
    hidden, kernel = _nnx.hidden_states_and_kernel(Decoder(layers=1), tokens)
    assert hidden.dtype == kernel.dtype == jnp.float32


def _snapshot(model):
    graphdef, state = nnx.split(model)
    types = [type(node) for _, node in nnx.iter_graph(model)]
    return graphdef, jax.tree.map(np.asarray, state), types


def _assert_unchanged(model, before):
    graphdef, state, types = _snapshot(model)
    assert graphdef == before[0]
    assert types == before[2]
    jax.tree.map(np.testing.assert_array_equal, state, before[1])


def test_the_model_is_left_as_it_was():
    model = Decoder(head="untied", bias=True, layers=1)
    tokens, _, _ = _data()
    logits, before = model(tokens), _snapshot(model)
    _nnx.hidden_states_and_kernel(model, tokens)
    _assert_unchanged(model, before)
    assert type(model.lm_head) is nnx.Linear and type(model.embed) is nnx.Embed
    np.testing.assert_array_equal(model(tokens), logits)
    # Repeated calls reuse the skipped classes.
    count = len(_nnx._SKIPPED_CLASSES)
    nnx.jit(lambda m: _nnx.hidden_states_and_kernel(m, tokens))(model)
    assert len(_nnx._SKIPPED_CLASSES) == count
    _assert_unchanged(model, before)


def test_the_model_is_left_as_it_was_when_the_call_raises():
    model = Decoder(layers=1)
    tokens, _, _ = _data()
    before = _snapshot(model)
    with pytest.raises(ValueError, match="Input type must be an integer"):
        _nnx.hidden_states_and_kernel(model, tokens.astype(jnp.float32))
    _assert_unchanged(model, before)
    assert model(tokens).shape == (BATCH, LENGTH, VOCAB)


class Named(nnx.Module):
    """A head under another name, optionally also called twice or returned with extras."""

    def __init__(self, mode="once"):
        rngs = nnx.Rngs(0)
        self.embed = nnx.Embed(VOCAB, D_MODEL, rngs=rngs)
        self.norm = nnx.RMSNorm(D_MODEL, rngs=rngs)
        self.decoder = nnx.Dict(out=nnx.Linear(D_MODEL, VOCAB, use_bias=False, rngs=rngs))
        self.mode = mode

    def __call__(self, tokens):
        x = self.norm(self.embed(tokens))
        logits = self.decoder["out"](x)
        if self.mode == "twice":
            return logits + self.decoder["out"](x)
        if self.mode == "tuple":
            return logits, x
        if self.mode == "tied too":
            return logits + self.embed.attend(x)
        return logits

    def last_logits(self, tokens):
        return self(tokens)[:, -1:]


def test_a_head_named_explicitly():
    model = Named()
    tokens, _, _ = _data()
    for head in ("decoder.out", model.decoder["out"]):
        hidden, kernel = _nnx.hidden_states_and_kernel(model, tokens, head=head)
        np.testing.assert_array_equal(kernel, model.decoder["out"].kernel[...])
        np.testing.assert_allclose(hidden @ kernel, model(tokens), rtol=1e-5, atol=1e-5)
    # Another method than __call__, by name or as a function.
    for method in ("last_logits", Named.last_logits):
        hidden, kernel = _nnx.hidden_states_and_kernel(model, tokens, head="decoder.out", method=method)
        assert hidden.shape == (BATCH, 1, D_MODEL)
        np.testing.assert_allclose(hidden @ kernel, model.last_logits(tokens), rtol=1e-5, atol=1e-5)


def test_errors():
    tokens, _, _ = _data()
    model = Named()
    # The default looks for lm_head and Embed.attend: this model has neither call.
    with pytest.raises(ValueError, match=r"exactly one call of embed \(Embed.attend\), got 0 calls; name the"):
        _nnx.hidden_states_and_kernel(model, tokens)
    with pytest.raises(ValueError, match=r"exactly one call of decoder.out \(Linear\), got 2 calls"):
        _nnx.hidden_states_and_kernel(Named("twice"), tokens, head="decoder.out")
    with pytest.raises(ValueError, match=r"lm_head \(Linear\) or embed \(Embed.attend\), got 2 calls"):
        _nnx.hidden_states_and_kernel(Decoder(layers=1), tokens, method=lambda m, t: m(t) + m.embed.attend(
            m.final_norm(m.embed(t))))
    with pytest.raises(ValueError, match=r"expected the model to return its logits, so that with decoder.out "
                                         r"\(Linear\) skipped it returns \[\.\.\., 16\] hidden states, got tuple"):
        _nnx.hidden_states_and_kernel(Named("tuple"), tokens, head="decoder.out")
    with pytest.raises(ValueError, match=r"expected head to be an attribute path .* got 'decoder.nope' "
                                         r"\(no 'nope' in Dict\)"):
        _nnx.hidden_states_and_kernel(model, tokens, head="decoder.nope")
    with pytest.raises(TypeError, match="expected head to name an nnx.Linear or nnx.Embed .* got RMSNorm"):
        _nnx.hidden_states_and_kernel(model, tokens, head="norm")
    with pytest.raises(TypeError,
                       match=r"expected an nnx.Module, got function \(Linen networks: linen_hidden_states_and_kernel"):
        _nnx.hidden_states_and_kernel(lambda t: t, tokens)
    # Every failure above left the model as it was.
    assert type(model.decoder["out"]) is nnx.Linear and type(model.embed) is nnx.Embed
    assert model(tokens).shape == (BATCH, LENGTH, VOCAB)


def test_the_skipped_head_outside_the_call_behaves_as_the_head():
    # A skipped class met outside hidden_states_and_kernel (say, another thread's call
    # of the same object) computes the projection.
    model = Decoder(bias=True, layers=1)
    x = jnp.ones((2, D_MODEL))
    expected = model.lm_head(x)
    object.__setattr__(model.lm_head, "__class__", _nnx._skipped_class(nnx.Linear, 0, _nnx.LINEAR))
    try:
        np.testing.assert_array_equal(model.lm_head(x), expected)
    finally:
        object.__setattr__(model.lm_head, "__class__", nnx.Linear)


def test_docstring_example():
    import doctest

    result = doctest.testmod(_nnx, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
