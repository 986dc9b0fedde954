"""The loss `ntl_jax.maxtext` puts into MaxText equals `cross_entropy_and_ntl` on
MaxText's own logits, is MaxText's loss bit for bit at weight 0, and is the same with
vocabulary tiling as without."""

import dataclasses

import pytest

pytest.importorskip("maxtext")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from maxtext.trainers.pre_train import train  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import maxtext as ntl_maxtext  # noqa: E402
from ntl_jax._core import variants  # noqa: E402
from ntl_jax.maxtext import tiles  # noqa: E402
from ntl_jax.maxtext.install import pretraining  # noqa: E402
from tests.maxtext import tiny  # noqa: E402

MULTI_DIGIT = ntl_maxtext.NumberLossSettings(weight=0.3, kind="was", digit_level=False)


@pytest.fixture(scope="module")
def setup():
    config = tiny.config()
    model, mesh = tiny.model(config)
    numbers = ntl_maxtext.number_tokens(config, digit_level=False)
    return config, model, mesh, numbers, tiny.batch(config, numbers)


def _loss(loss_fn, model, config, data):
    """`(loss, aux, grads)` of a MaxText loss function, differentiated as its train_step does."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def objective(params):
        loss, aux = loss_fn(nnx.merge(graphdef, params, rest, copy=True), config, dict(data), None, None,
                            is_train=True)
        return loss, {k: aux[k] for k in aux if k in ("xent_sum", "total_weights", "ntl_sum", "number_targets")}

    (loss, aux), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(params)
    return loss, aux, grads


def _reference(model, config, data, numbers, settings):
    """`cross_entropy_and_ntl` on the logits MaxText's model computes, its gradients."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    real = data["targets_segmentation"] != 0

    def objective(params):
        local = nnx.merge(graphdef, params, rest, copy=True)
        logits = local(decoder_input_tokens=data["inputs"], decoder_positions=data["inputs_position"],
                       decoder_segment_ids=data["inputs_segmentation"], enable_dropout=False,
                       decoder_target_tokens=data["targets"], decoder_target_mask=data["targets_segmentation"])
        return ntl_jax.cross_entropy_and_ntl(logits, data["targets"], numbers, weights=real, ntl_kind=settings.kind,
                                             ntl_weight=settings.weight,
                                             loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")

    (loss, parts), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(params)
    return loss, parts, grads


def _assert_trees_close(actual, expected, rtol):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e))) or 1.0
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("kind", variants.KINDS)
def test_the_loss_equals_cross_entropy_and_ntl_on_maxtexts_logits(setup, kind):
    config, model, mesh, numbers, data = setup
    settings = dataclasses.replace(MULTI_DIGIT, kind=kind)
    with jax.set_mesh(mesh):
        loss, aux, grads = _loss(ntl_maxtext.number_loss_fn(train.loss_fn, settings), model, config, data)
        expected, parts, expected_grads = _reference(model, config, data, numbers, settings)
    assert float(aux["number_targets"]) >= 10  # of the 54 real targets, about a third numbers
    assert float(parts["ntl"]) > 0
    # float32 rounding of sums over 54 targets and a vocabulary of 128k
    np.testing.assert_allclose(float(loss), float(expected), rtol=2e-6)
    np.testing.assert_allclose(float(aux["ntl_sum"] / aux["total_weights"]), float(parts["ntl"]), rtol=2e-6)
    np.testing.assert_allclose(float(aux["xent_sum"] / aux["total_weights"]), float(parts["cross_entropy"]),
                               rtol=2e-6)
    _assert_trees_close(grads, expected_grads, rtol=1e-5)


def test_weight_zero_is_maxtexts_own_loss_bit_for_bit(setup):
    config, model, mesh, numbers, data = setup
    with jax.set_mesh(mesh):
        stock_loss, stock_aux, stock_grads = _loss(train.loss_fn, model, config, data)
        settings = dataclasses.replace(MULTI_DIGIT, weight=0.0)
        loss, aux, grads = _loss(ntl_maxtext.number_loss_fn(train.loss_fn, settings), model, config, data)
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


# (kind, tiles, z-loss): inside the tiles wherever their tiles hold whole sequences (the
# tiny batch is 2 x 32 positions) or the kind reads one position at a time; else, and with
# a z-loss (whose slot carries NTL out of the tiles), from the hidden states.
TILINGS = [*((kind, 2, 0.0) for kind in variants.KINDS), ("was", 4, 0.0), ("del", 4, 0.0),
           ("number_level", 4, 0.0), ("was", 4, 1e-4)]


@pytest.mark.parametrize("kind, num_tiles, z_loss", TILINGS)
def test_vocabulary_tiling_gives_the_untiled_loss(setup, kind, num_tiles, z_loss):
    _, _, mesh, _, data = setup
    config = tiny.config(f"z_loss_multiplier={z_loss}")
    model, _ = tiny.model(config)
    tiled = tiny.config(f"num_vocab_tiling={num_tiles}", f"z_loss_multiplier={z_loss}")
    tiled_model, _ = tiny.model(tiled)
    settings = dataclasses.replace(MULTI_DIGIT, kind=kind)
    with jax.set_mesh(mesh):
        loss, aux, grads = _installed_loss(settings, model, config, data)
        tiled_loss, tiled_aux, tiled_grads = _installed_loss(settings, tiled_model, tiled, data)
    expect_in_tiles = z_loss == 0 and (num_tiles == 2 or kind not in tiles.ACROSS_POSITIONS)
    assert tiles.fits(tiled, settings, 2, 32) == expect_in_tiles
    assert (tiles._ACTIVE is not None) == expect_in_tiles  # the route the step was traced through
    assert float(aux["ntl_sum"]) > 0
    np.testing.assert_allclose(float(tiled_aux["ntl_sum"]), float(aux["ntl_sum"]), rtol=2e-6)
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
        stock_loss, stock_aux, stock_grads = _loss(train.loss_fn, model, tiled, data)
        loss, aux, grads = _installed_loss(settings, model, tiled, data)
    assert tiles._ACTIVE is not None
    assert float(aux["ntl_sum"]) > 0  # still computed, for the metrics
    assert np.asarray(loss).tobytes() == np.asarray(stock_loss).tobytes()
    assert np.asarray(aux["xent_sum"]).tobytes() == np.asarray(stock_aux["xent_sum"]).tobytes()
    for a, e in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(stock_grads), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(e).tobytes()


def test_settings_come_off_the_command_line_and_bad_ones_are_refused():
    argv, settings = ntl_maxtext.split_argv(["prog", "base.yml", "steps=3", "ntl_weight=0.1", "ntl_kind=del",
                                             "ntl_digit_level=false"])
    assert argv == ["prog", "base.yml", "steps=3"]
    assert settings == ntl_maxtext.NumberLossSettings(weight=0.1, kind="del", digit_level=False)
    with pytest.raises(ValueError, match=r"ntl_\* key in .*got 'ntl_wieght'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_wieght=0.1"])
    with pytest.raises(ValueError, match=r"ntl_weight to be a finite number >= 0, got -1.0"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_weight=-1"])
    with pytest.raises(ValueError, match=r"ntl_kind in .*got 'wass'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_kind=wass"])
    with pytest.raises(ValueError, match=r"ntl_squash_factor applies only to ntl_kind in \('was', 'smmd'\), "
                                         r"got ntl_kind=mse"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_kind=mse", "ntl_squash_factor=2"])
    _, settings = ntl_maxtext.split_argv(["prog", "base.yml", "ntl_kind=smmd", "ntl_squash_factor=4",
                                          "ntl_smmd_mode=mmd", "ntl_smmd_sigma=1.5", "ntl_smmd_alpha=0.2"])
    assert settings == ntl_maxtext.NumberLossSettings(kind="smmd", squash_factor=4.0, smmd_mode="mmd",
                                                      smmd_sigma=1.5, smmd_alpha=0.2)
    with pytest.raises(ValueError, match=r"smmd_sigma applies only to ntl_kind='smmd', got ntl_kind='was'"):
        ntl_maxtext.split_argv(["prog", "base.yml", "ntl_smmd_sigma=1"])


class _Config:
    def __init__(self, **values):
        self.__dict__.update(values)


def test_maxtext_settings_ntl_cannot_be_right_with_are_refused_by_name():
    settings = ntl_maxtext.NumberLossSettings()
    with pytest.raises(ValueError, match=r"dropout_rate=0 .*got dropout_rate=0.1"):
        ntl_maxtext.check_config(tiny.config("dropout_rate=0.1"), settings)
    ntl_maxtext.check_config(tiny.config("dropout_rate=0.1"), dataclasses.replace(settings, kind="none"))
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
