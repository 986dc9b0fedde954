"""The loss `ntl_jax.maxtext` puts into MaxText equals `cross_entropy_and_ntl` on
MaxText's own logits, its metrics are that objective's parts, it is MaxText's loss bit
for bit at weight 0, and the same with vocabulary tiling as without; for every shipped
loss and for one of one's own."""

import dataclasses

import pytest

pytest.importorskip("maxtext")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from maxtext.trainers.pre_train import train  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import losses  # noqa: E402
from ntl_jax import maxtext as ntl_maxtext  # noqa: E402
from ntl_jax.maxtext import install, step, tiles  # noqa: E402
from ntl_jax.maxtext.install import pretraining  # noqa: E402
from ntl_jax.maxtext.loss import ntl_metrics  # noqa: E402
from tests.maxtext import tiny  # noqa: E402
from tests.objective_options import registered_loss  # noqa: E402

MULTI_DIGIT = ntl_maxtext.NumberLossSettings(weight=0.3, number_loss="was", digit_level=False)
# Every shipped loss by its spec that scores multi-digit tokens (NTIL reads single
# digits: its own test below), and the brief's loss of one's own.
DIGITS_ONLY = ("ntil",)
LOSSES = [*(name for name in losses.NAMES if name not in DIGITS_ONLY), tiny.SQUARED_DISTANCE]
AUX = ("xent_sum", "total_weights", "ntl_sum", "ntl_weight_sum", "number_targets", "ntl_term_sum")


def _id(number_loss):
    return number_loss if isinstance(number_loss, str) else number_loss.name


@pytest.fixture(scope="module")
def setup():
    config = tiny.config()
    model, mesh = tiny.model(config)
    numbers = ntl_maxtext.number_tokens(config, digit_level=False)
    return config, model, mesh, numbers, tiny.batch(config, numbers)


def _loss(loss_fn, model, config, data):
    """`(loss, aux, grads, traced)` of a MaxText loss function, differentiated as its
    train_step does, in a `step.step` as the launcher traces MaxText's: `traced` is that
    step's state, whose `in_tiles` says whether NTL was computed inside the tiles."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    steps = []

    def objective(params):
        loss, aux = loss_fn(nnx.merge(graphdef, params, rest, copy=True), config, dict(data), None, None,
                            is_train=True)
        return loss, {k: aux[k] for k in aux if k in AUX}

    def train_step(params):
        with step.step(train=True) as traced:
            out = jax.value_and_grad(objective, has_aux=True)(params)
        steps.append(traced)
        return out

    (loss, aux), grads = jax.jit(train_step)(params)
    assert step.current() is None  # nothing of the step outlives it
    return loss, aux, grads, steps[0]


def _reference(model, config, data, numbers, settings, own_weight=False):
    """`cross_entropy_and_ntl` on the logits MaxText's model computes, its gradients
    (`own_weight`: with no λ given, the loss's own)."""
    weight = {} if own_weight else {"ntl_weight": settings.weight}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    real = data["targets_segmentation"] != 0

    def objective(params):
        local = nnx.merge(graphdef, params, rest, copy=True)
        logits = local(decoder_input_tokens=data["inputs"], decoder_positions=data["inputs_position"],
                       decoder_segment_ids=data["inputs_segmentation"], enable_dropout=False,
                       decoder_target_tokens=data["targets"], decoder_target_mask=data["targets_segmentation"])
        return ntl_jax.cross_entropy_and_ntl(logits, data["targets"], numbers, weights=real,
                                             number_loss=settings.number_loss, **weight,
                                             loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")

    (loss, parts), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(params)
    return loss, parts, grads


def _assert_trees_close(actual, expected, rtol):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e))) or 1.0
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("number_loss", LOSSES, ids=_id)
def test_the_loss_equals_cross_entropy_and_ntl_on_maxtexts_logits(setup, number_loss):
    """With no `ntl_weight` given, on either side: each loss at its own λ, its term
    normalised as its authors normalise it."""
    config, model, mesh, numbers, data = setup
    settings = ntl_maxtext.NumberLossSettings(number_loss=number_loss, digit_level=False)
    assert settings.weight == settings.number_loss.default_weight
    with jax.set_mesh(mesh):
        loss, aux, grads, traced = _loss(ntl_maxtext.number_loss_fn(train.loss_fn, settings), model, config, data)
        expected, parts, expected_grads = _reference(model, config, data, numbers, settings, own_weight=True)
    assert not traced.in_tiles  # from the hidden states
    assert float(aux["number_targets"]) >= 10  # of the 54 real targets, about a third numbers
    assert float(parts["ntl"]) > 0
    # float32 rounding of sums over 54 targets and a vocabulary of 128k
    np.testing.assert_allclose(float(loss), float(expected), rtol=2e-6)
    np.testing.assert_allclose(float(aux["ntl_weight_sum"]), float(parts["ntl_weight_sum"]), rtol=0)
    # The metrics logged are the objective's parts: NTL's mean over the positions it
    # counts, and the term it adds to the loss.
    metrics = ntl_metrics(aux, "learning", settings.weight, settings.number_loss)
    np.testing.assert_allclose(float(metrics["learning/ntl"]), float(parts["ntl"]), rtol=2e-6)
    np.testing.assert_allclose(float(metrics["learning/ntl_term"]), float(parts["ntl_term"]), rtol=2e-6)
    np.testing.assert_allclose(float(aux["xent_sum"] / aux["total_weights"]), float(parts["cross_entropy"]),
                               rtol=2e-6)
    _assert_trees_close(grads, expected_grads, rtol=1e-5)


@pytest.mark.parametrize("number_loss", ["ntil", "squared_gap"])
def test_ntil_and_a_registered_loss_equal_cross_entropy_and_ntl_on_digits(setup, number_loss):
    """NTIL on Llama-3's digit tokens, its term scaled to MaxText's cross-entropy, and a
    loss a package registers, as `cross_entropy_and_ntl` computes them."""
    registered_loss()
    config, model, mesh, _, _ = setup
    numbers = ntl_maxtext.number_tokens(config, digit_level=True)
    data = tiny.batch(config, numbers)
    settings = ntl_maxtext.NumberLossSettings(weight=0.3, number_loss=number_loss, digit_level=True)
    with jax.set_mesh(mesh):
        loss, aux, grads, _ = _loss(ntl_maxtext.number_loss_fn(train.loss_fn, settings), model, config, data)
        expected, parts, expected_grads = _reference(model, config, data, numbers, settings)
    assert float(parts["ntl"]) > 0
    np.testing.assert_allclose(float(loss), float(expected), rtol=2e-6)
    metrics = ntl_metrics(aux, "learning", settings.weight, settings.number_loss)
    np.testing.assert_allclose(float(metrics["learning/ntl"]), float(parts["ntl"]), rtol=2e-6)
    np.testing.assert_allclose(float(metrics["learning/ntl_term"]), float(parts["ntl_term"]), rtol=2e-6)
    _assert_trees_close(grads, expected_grads, rtol=1e-5)


def _squared_distance_reference(model, data, numbers):
    """`sum_j softmax(z)_j (v_j - y)^2` over the number tokens' logits `z`, averaged over
    the real number targets, in NumPy from MaxText's logits (of a copy of `model`)."""
    local = nnx.merge(*nnx.split(model), copy=True)
    logits = local(decoder_input_tokens=data["inputs"], decoder_positions=data["inputs_position"],
                   decoder_segment_ids=data["inputs_segmentation"], enable_dropout=False,
                   decoder_target_tokens=data["targets"], decoder_target_mask=data["targets_segmentation"])
    ids = np.asarray(numbers.ids)
    values = np.asarray(numbers.number_values, np.float64)
    z = np.asarray(logits, np.float64)[..., ids]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    targets = np.asarray(data["targets"])
    slot = {int(token): j for j, token in enumerate(ids)}
    counted = np.isin(targets, ids) & (np.asarray(data["targets_segmentation"]) != 0)
    y = np.where(counted, values[np.vectorize(lambda t: slot.get(int(t), 0))(targets)], 0.0)
    per_position = np.sum(p * np.square(values - y[..., None]), axis=-1)
    return per_position[counted].mean(), counted.sum()


@pytest.mark.parametrize("num_tiles, across_positions, in_tiles", [
    (1, None, False),  # untiled: from the hidden states
    (2, None, True),  # tiles of whole sequences: inside the tiles, whatever the loss reads
    (4, None, False),  # tiles that split sequences: a loss of one's own may read across them
    (4, False, True),  # the same tiles, a loss that says it reads its own position alone
])
def test_a_loss_of_ones_own_is_its_reference_on_each_route(setup, num_tiles, across_positions, in_tiles):
    # Where the loss is computed follows `NumberLoss.across_positions`, which a loss of
    # one's own leaves True unless it says otherwise.
    _, untiled_model, mesh, numbers, data = setup
    config = tiny.config(f"num_vocab_tiling={num_tiles}")
    model, _ = tiny.model(config)  # the same parameters as the untiled model's
    number_loss = tiny.SQUARED_DISTANCE
    if across_positions is not None:
        number_loss = dataclasses.replace(number_loss, across_positions=across_positions)
    settings = dataclasses.replace(MULTI_DIGIT, number_loss=number_loss)
    with jax.set_mesh(mesh):
        loss, aux, _, traced = _installed_loss(settings, model, config, data)
        expected, count = _squared_distance_reference(untiled_model, data, numbers)
    assert bool(traced.in_tiles) == in_tiles
    assert float(aux["ntl_weight_sum"]) == count >= 10
    metrics = ntl_metrics(aux, "learning", settings.weight)
    np.testing.assert_allclose(float(metrics["learning/ntl"]), expected, rtol=1e-5)
    # The paper's: λ x the mean over the number targets, beside the cross-entropy's mean.
    np.testing.assert_allclose(float(metrics["learning/ntl_term"]), 0.3 * expected, rtol=1e-5)
    cross_entropy = aux["xent_sum"] / aux["total_weights"]
    np.testing.assert_allclose(float(loss), float(cross_entropy + metrics["learning/ntl_term"]), rtol=2e-6)


def test_weight_zero_is_maxtexts_own_loss_bit_for_bit(setup):
    config, model, mesh, numbers, data = setup
    with jax.set_mesh(mesh):
        stock_loss, stock_aux, stock_grads, _ = _loss(train.loss_fn, model, config, data)
        settings = dataclasses.replace(MULTI_DIGIT, weight=0.0)
        loss, aux, grads, _ = _loss(ntl_maxtext.number_loss_fn(train.loss_fn, settings), model, config, data)
    assert float(aux["ntl_sum"]) > 0  # still computed, for the metrics
    assert np.asarray(loss).tobytes() == np.asarray(stock_loss).tobytes()
    for a, e in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(stock_grads), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(e).tobytes()


def _installed_loss(settings, model, config, data):
    """`_loss` of MaxText's `loss_fn` as the launcher runs it: with the tiled loss that
    computes NTL inside the vocabulary tiles installed while the step, backward pass
    included, is traced."""
    with pretraining(settings):
        return _loss(train.loss_fn, model, config, data)


# (loss, tiles, z-loss): inside the tiles wherever their tiles hold whole sequences (the
# tiny batch is 2 x 32 positions) or the loss reads one position at a time; else, and with
# a z-loss (whose slot carries NTL out of the tiles), from the hidden states.
TILINGS = [*((number_loss, 2, 0.0) for number_loss in LOSSES), ("was", 4, 0.0), ("del", 4, 0.0),
           ("number_level", 4, 0.0), (tiny.SQUARED_DISTANCE, 4, 0.0), ("was", 4, 1e-4)]


@pytest.mark.parametrize("number_loss, num_tiles, z_loss", TILINGS,
                         ids=[f"{_id(loss)}-{tiles}-{z}" for loss, tiles, z in TILINGS])
def test_vocabulary_tiling_gives_the_untiled_loss(setup, number_loss, num_tiles, z_loss):
    _, _, mesh, _, data = setup
    config = tiny.config(f"z_loss_multiplier={z_loss}")
    model, _ = tiny.model(config)
    tiled = tiny.config(f"num_vocab_tiling={num_tiles}", f"z_loss_multiplier={z_loss}")
    tiled_model, _ = tiny.model(tiled)
    settings = dataclasses.replace(MULTI_DIGIT, number_loss=number_loss)
    with jax.set_mesh(mesh):
        loss, aux, grads, _ = _installed_loss(settings, model, config, data)
        tiled_loss, tiled_aux, tiled_grads, traced = _installed_loss(settings, tiled_model, tiled, data)
    expect_in_tiles = z_loss == 0 and (num_tiles == 2 or tiles.reads_one_position(settings.number_loss))
    assert tiles.fits(tiled, settings, 2, 32) == expect_in_tiles
    # The route the step was traced through; inside the tiles their backward pass adds NTL.
    assert traced.in_tiles == int(expect_in_tiles) and bool(traced.backward_calls) == expect_in_tiles
    assert float(aux["ntl_sum"]) > 0
    np.testing.assert_allclose(float(tiled_aux["ntl_sum"]), float(aux["ntl_sum"]), rtol=2e-6)
    assert float(tiled_aux["ntl_weight_sum"]) == float(aux["ntl_weight_sum"]) > 0
    # MaxText's cross-entropy sum stays its own: NTL's weighted sum comes back out of it.
    np.testing.assert_allclose(float(tiled_aux["xent_sum"]), float(aux["xent_sum"]), rtol=2e-6)
    np.testing.assert_allclose(float(tiled_loss), float(loss), rtol=2e-6)
    _assert_trees_close(tiled_grads, grads, rtol=1e-5)


def test_weight_zero_in_the_tiles_is_maxtexts_own_tiled_loss_bit_for_bit(setup):
    _, _, mesh, _, data = setup
    tiled = tiny.config("num_vocab_tiling=2")
    model, _ = tiny.model(tiled)
    settings = dataclasses.replace(MULTI_DIGIT, weight=0.0)
    with jax.set_mesh(mesh):
        stock_loss, stock_aux, stock_grads, _ = _loss(train.loss_fn, model, tiled, data)
        loss, aux, grads, traced = _installed_loss(settings, model, tiled, data)
    assert traced.in_tiles == 1
    assert float(aux["ntl_sum"]) > 0  # still computed, for the metrics
    assert np.asarray(loss).tobytes() == np.asarray(stock_loss).tobytes()
    assert np.asarray(aux["xent_sum"]).tobytes() == np.asarray(stock_aux["xent_sum"]).tobytes()
    for a, e in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(stock_grads), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(e).tobytes()


def test_settings_come_off_the_command_line_and_bad_ones_are_refused():
    argv, settings = ntl_maxtext.split_argv(["prog", "base.yml", "steps=3", "ntl_weight=0.1", "ntl_number_loss=del",
                                             "ntl_digit_level=false"])
    assert argv == ["prog", "base.yml", "steps=3"]
    assert settings == ntl_maxtext.NumberLossSettings(weight=0.1, number_loss="del", digit_level=False)
    assert settings.number_loss is losses.digit_entropy()
    with pytest.raises(ValueError, match=r"ntl_\* key in .*got 'ntl_wieght'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_wieght=0.1"])
    with pytest.raises(ValueError, match=r"ntl_weight to be a finite number >= 0, got -1.0"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_weight=-1"])
    with pytest.raises(ValueError, match=r"ntl_number_loss='wass': expected a number loss in .*got 'wass'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_number_loss=wass"])
    # A bad spec names the loss and its parameter.
    with pytest.raises(ValueError, match=r"number loss 'mse' has no parameter 'squash_factor'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_number_loss=mse(squash_factor=2)"])
    with pytest.raises(ValueError, match=r"number loss 'smmd'.*mode"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_number_loss=smmd(mode=wide)"])
    _, settings = ntl_maxtext.split_argv(["prog", "base.yml",
                                          "ntl_number_loss=smmd(squash_factor=4, mode=mmd, sigma=1.5, alpha=0.2)"])
    assert settings == ntl_maxtext.NumberLossSettings(
        number_loss=losses.smmd(squash_factor=4.0, mode="mmd", sigma=1.5, alpha=0.2))
    _, settings = ntl_maxtext.split_argv(["prog", "base.yml", "ntl_number_loss=none"])
    assert settings.number_loss is None and not settings.computes_ntl


def test_the_keys_of_0_2_are_refused_with_the_key_that_replaced_them():
    for old, spec in ((["ntl_kind=del"], "del"),
                      (["ntl_kind=smmd", "ntl_squash_factor=4", "ntl_smmd_mode=mmd", "ntl_smmd_sigma=1.5"],
                       "smmd(squash_factor=4, mode=mmd, sigma=1.5)"),
                      (["ntl_squash_factor=2"], "was(squash_factor=2)"),
                      (["ntl_smmd_sigma=1"], "smmd(sigma=1)"),
                      (["ntl_max_number_length=10"], "number_level(max_number_length=10)")):
        with pytest.raises(ValueError) as refused:
            ntl_maxtext.split_argv(["prog", "base.yml", *old])
        keys = ", ".join(arg.partition("=")[0] for arg in old)
        assert str(refused.value).startswith(f"{keys} ")
        assert f"'ntl_number_loss={spec}'" in str(refused.value)
        # ... and the spec it names is the loss they set.
        losses.parse(spec)


def test_a_number_loss_of_ones_own_comes_from_python():
    argv, settings = ntl_maxtext.split_argv(["prog", "base.yml", "ntl_weight=0.1"],
                                            number_loss=tiny.SQUARED_DISTANCE)
    assert argv == ["prog", "base.yml"]
    assert settings.number_loss is tiny.SQUARED_DISTANCE and settings.weight == 0.1
    with pytest.raises(ValueError, match=r"ntl_number_loss is given twice: on the command line and as number_loss="):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_number_loss=was"], number_loss=tiny.SQUARED_DISTANCE)
    with pytest.raises(TypeError, match=r"expected settings among the fields of NumberLossSettings .*got kind="):
        ntl_maxtext.split_argv(["prog", "base.yml"], kind="was")
    with pytest.raises(TypeError, match=r"expected ntl_number_loss a NumberLoss .*got the function"):
        ntl_maxtext.NumberLossSettings(number_loss=lambda x, y: x)


class _Config:
    def __init__(self, **values):
        self.__dict__.update(values)


def test_maxtext_settings_ntl_cannot_be_right_with_are_refused_by_name():
    settings = ntl_maxtext.NumberLossSettings()
    with pytest.raises(ValueError, match=r"dropout_rate=0 .*got dropout_rate=0.1"):
        ntl_maxtext.check_config(tiny.config("dropout_rate=0.1"), settings)
    ntl_maxtext.check_config(tiny.config("dropout_rate=0.1"), dataclasses.replace(settings, number_loss=None))
    ntl_maxtext.check_config(tiny.config("dropout_rate=0.1", "enable_dropout=false"), settings)
    with pytest.raises(ValueError, match=r"training_objective=causal_lm .*got training_objective=block_diffusion"):
        ntl_maxtext.check_config(_Config(training_objective="block_diffusion"), settings)


@pytest.mark.parametrize("kind, path, vocab, digits, numbers, largest", [
    ("huggingface", "qwen3-tokenizer", 151936, 10, 10, 9),  # Qwen writes one token per digit
    ("sentencepiece", "tokenizer.llama2", 32000, 10, 11, 9),  # and "00"
    ("tiktoken", "tokenizer_llama3.tiktoken", 128256, 10, 1110, 999),  # 0-999, and 00-09 and 000-099
])
def test_the_number_tokens_come_from_the_tokenizer_the_config_names(kind, path, vocab, digits, numbers, largest):
    import os

    config = _Config(tokenizer_type=kind, tokenizer_path=os.path.join(tiny.ASSETS, path), vocab_size=vocab,
                     hf_access_token="")
    assert ntl_maxtext.number_tokens(config).num_numbers == digits
    table = ntl_maxtext.number_tokens(config, digit_level=False)
    assert table.num_numbers == numbers and float(table.number_values.max()) == largest
    with pytest.raises(ValueError, match=r"at most vocab_size=1000 ids, got"):
        ntl_maxtext.number_tokens(_Config(**{**config.__dict__, "vocab_size": 1000}))
    with pytest.raises(ValueError, match=r"expected tokenizer_path .*got tokenizer_path=''"):
        ntl_maxtext.number_tokens(_Config(**{**config.__dict__, "tokenizer_path": ""}))


@pytest.mark.parametrize("number_loss, term_sum, term", [
    ("was", 0.3 * 2.0 * 8.0, 0.3 * 2.0),  # weight x NTL's mean (2 / 1), beside CE's mean
    ("ntil", 0.3 * 12.0, 0.3 * 12.0 / 8.0),  # scaled to CE: weight x CE, whatever NTIL's sum
])
def test_fine_tuning_logs_the_term_each_loss_adds(number_loss, term_sum, term):
    pytest.importorskip("tunix")
    from types import SimpleNamespace

    buffer = SimpleNamespace(additional_metrics={})
    aux = {"ntl_sum": jnp.float32(2.0), "ntl_weight_sum": jnp.float32(1.0), "number_targets": jnp.int32(4),
           "total_weights": jnp.float32(8.0), "xent_sum": jnp.float32(12.0)}
    settings = ntl_maxtext.NumberLossSettings(weight=0.3, number_loss=number_loss, digit_level=True)
    # As the loss function puts it in the aux: the term beside the cross-entropy's sum.
    made = settings.number_loss.term(aux["xent_sum"], settings.number_loss.normalised(
        aux["ntl_sum"], aux["ntl_weight_sum"], aux["total_weights"]), settings.weight)
    np.testing.assert_allclose(float(made), term_sum, rtol=1e-6)
    aux["ntl_term_sum"] = made
    install._buffer_ntl(buffer, aux, settings)
    [logged], _ = buffer.additional_metrics["ntl_term"]
    np.testing.assert_allclose(float(logged), term, rtol=1e-6)
