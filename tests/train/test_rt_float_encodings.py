"""The Regression Transformer's float encodings: the table against the authors' formula,
and the networks that add it to their input embeddings."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax.data import rt_vocabulary
from ntl_jax.flax.number_embeddings import added_to_embeddings
from ntl_jax.train import network

V_MAX = 3000000000  # the authors' t5_rt.py


def authors_float_encoding(token: str, embedding_size: int) -> np.ndarray:
    """`get_float_encoding(token, embedding_size, V_MAX, log_scale=True)` of the authors'
    numerical_encodings.py, transcribed: Python floats stored in float32, then the log
    scale in float32, as their torch code computes it."""
    vals = np.zeros((embedding_size,), np.float32)
    if len(token) == 1 or not (token.startswith("_") and token.endswith("_") and token.count("_") == 3):
        return vals
    digit = int(token[1])
    order = int(token.split("_")[-2])
    val = digit * 10 ** order
    for i in range(0, embedding_size, 2):
        vals[i] = val / (i + 1)
        vals[i + 1] = -val / (i + 1)
    return (np.sign(vals) * np.log10(np.abs(vals) + 1) / (np.log10(np.float32(V_MAX)) / 10)).astype(np.float32)


@pytest.fixture(scope="module")
def vocab():
    return rt_vocabulary.vocabulary()


def test_the_table_is_the_authors_encoding_of_every_piece(vocab):
    table = vocab.float_encodings(16, rows=1664)
    assert table.shape == (1664, 16) and table.dtype == np.float32
    expected = np.zeros_like(table)
    for i in range(vocab.base_size, vocab.vocab_size):
        expected[i] = authors_float_encoding(vocab.id_to_piece(i), 16)
    # float32 storage and log10 in float32 against float64 rounded once: a few ulps
    np.testing.assert_allclose(table, expected, rtol=2e-6, atol=1e-7)
    assert not table[: vocab.base_size].any() and not table[vocab.vocab_size:].any()


def test_hand_values(vocab):
    divisor = math.log10(V_MAX) / 10
    row = vocab.float_encodings(4)[vocab.rt_id(7, -2)]  # 0.07
    want = [math.log10(1.07) / divisor, -math.log10(1.07) / divisor,
            math.log10(1 + 0.07 / 3) / divisor, -math.log10(1 + 0.07 / 3) / divisor]
    np.testing.assert_allclose(row, want, rtol=1e-6)
    assert not vocab.float_encodings(4)[vocab.rt_id(0, 5)].any()  # a zero digit has value 0
    assert vocab.float_encodings(2)[vocab.rt_id(9, 31)][0] == pytest.approx(math.log10(9e31 + 1) / divisor)


@pytest.mark.parametrize("emb_dim, rows, error", [(3, None, "even emb_dim"), (0, None, "even emb_dim"),
                                                  (4, 100, "rows >= vocab_size")])
def test_bad_shapes_raise(vocab, emb_dim, rows, error):
    with pytest.raises(ValueError, match=error):
        vocab.float_encodings(emb_dim, rows)


def _shifted(params, table):
    """The parameters with the encodings folded into the (untied) input embedding."""
    embedding = params["token_embedder"]["embedding"]
    return {**params, "token_embedder": {"embedding": embedding + jnp.asarray(table)}}


@pytest.mark.parametrize("architecture", network.ARCHITECTURES)
def test_the_rt_network_is_the_network_with_the_encodings_in_its_embedding(vocab, architecture):
    cfg = network.make_config("micro", vocab.vocab_size)
    rt_model = network.make_model(architecture, cfg, "rt")
    plain = network.make_model(architecture, cfg)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(2, vocab.vocab_size, (3, 7)), jnp.int32)
    targets = jnp.asarray(rng.integers(2, vocab.vocab_size, (3, 5)), jnp.int32)
    inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
    args = (tokens, inputs, targets) if architecture == "encoder-decoder" else (inputs, targets)
    params = plain.init(jax.random.key(1), *args, enable_dropout=False)["params"]
    table = rt_model.rt_float_encodings()
    assert table.shape == (cfg.vocab_size, cfg.emb_dim) and np.abs(table).max() > 1
    got = rt_model.apply({"params": params}, *args, enable_dropout=False)
    want = plain.apply({"params": _shifted(params, table)}, *args, enable_dropout=False)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(got - plain.apply({"params": params}, *args, enable_dropout=False)).max() > 1e-3
    if architecture == "encoder-decoder":  # encode and decode on their own add it once each
        encoded = rt_model.apply({"params": params}, tokens, enable_dropout=False, method=rt_model.encode)
        logits = rt_model.apply({"params": params}, encoded, tokens, inputs, targets, enable_dropout=False,
                                method=rt_model.decode)
        np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)


def test_nested_contexts_add_the_table_once():
    embed = network.nn.Embed(4, 2, name="token_embedder")
    ids = jnp.array([0, 3])
    params = embed.init(jax.random.key(0), ids)
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    with added_to_embeddings(table), added_to_embeddings(table * 100):
        got = embed.apply(params, ids)
    np.testing.assert_array_equal(got, params["params"]["embedding"][ids] + table[[0, 3]])


def test_the_trainer_adds_them_to_the_rt_systems_only():
    from ntl_jax.train.trainer import TrainConfig

    assert TrainConfig(loss="rt").float_encodings() == "rt"
    assert TrainConfig(loss="rt+ntl-mse", rt_float_encodings=False).float_encodings() == "none"
    assert TrainConfig(loss="ce").float_encodings() == "none"
    assert TrainConfig(loss="rt").identity()["rt_float_encodings"] is True
    assert "rt_float_encodings" not in TrainConfig(loss="ntl-was").identity()
    # RT runs saved before the option (without encodings) resume with it off
    assert "rt_float_encodings" not in TrainConfig(loss="rt", rt_float_encodings=False).identity()
    with pytest.raises(ValueError, match="float_encodings must be one of"):
        network.make_model("encoder-decoder", network.make_config("micro", 100), "xval")
