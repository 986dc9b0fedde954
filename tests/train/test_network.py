"""The T5.1.1 network: shapes, buckets, masks and packing."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402

from ntl_jax.train import network  # noqa: E402


def _init(cfg, enc_len=5, dec_len=3, batch=2):
    model = network.Transformer(cfg)
    enc = jnp.ones((batch, enc_len), jnp.int32)
    dec = jnp.ones((batch, dec_len), jnp.int32)
    params = model.init(jax.random.key(0), enc, dec, dec, enable_dropout=False)["params"]
    return model, params


def test_micro_parameter_and_logit_shapes():
    cfg = network.make_config("micro", vocab_size=100)
    assert cfg.vocab_size == 128  # rounded up to a multiple of 128, as T5X does
    model, params = _init(cfg)
    shapes = jax.tree_util.tree_map(lambda x: x.shape, params)
    # emb 16, 2 heads x head_dim 8, mlp 32, one layer each side, 32 buckets.
    assert shapes["token_embedder"]["embedding"] == (128, 16)
    enc = shapes["encoder"]["layers_0"]
    assert enc["attention"]["query"]["kernel"] == (16, 2, 8)
    assert enc["attention"]["out"]["kernel"] == (2, 8, 16)
    assert enc["mlp"]["wi_0"]["kernel"] == (16, 32)
    assert enc["mlp"]["wi_1"]["kernel"] == (16, 32)
    assert enc["mlp"]["wo"]["kernel"] == (32, 16)
    assert shapes["encoder"]["relpos_bias"]["rel_embedding"] == (2, 32)
    dec = shapes["decoder"]
    assert set(dec["layers_0"]) == {"self_attention", "encoder_decoder_attention", "mlp",
                                     "pre_self_attention_layer_norm",
                                     "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"}
    assert dec["logits_dense"]["kernel"] == (16, 128)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    # embed 2048 + enc layer (4*256 + 3*512 + 2*16) + enc norm 16 + enc rel 64
    # + dec layer (8*256 + 3*512 + 3*16) + dec norm 16 + dec rel 64 + logits 2048
    assert n_params == 2048 + 2592 + 16 + 64 + 3632 + 16 + 64 + 2048
    logits = model.apply({"params": params}, jnp.ones((4, 7), jnp.int32),
                         jnp.ones((4, 6), jnp.int32), jnp.ones((4, 6), jnp.int32),
                         enable_dropout=False)
    assert logits.shape == (4, 6, 128) and logits.dtype == jnp.float32
    encoded = model.apply({"params": params}, jnp.ones((4, 7), jnp.int32),
                          enable_dropout=False, method=model.encode)
    assert encoded.shape == (4, 7, 16)


def test_relative_position_buckets_hand_checked():
    rel = np.array([0, -1, 1, -7, -8, -200, 200, 15])
    got = network.relative_position_bucket(rel, bidirectional=True, num_buckets=32,
                                           max_distance=128)
    # key before query (negative): n > 0 -> 0..15; key after: 16 + |n|.
    # |n| < 8 exact; beyond, log buckets 8..15: 15 -> 8 + int(8 * log(15/8) / log(16)) = 9
    assert got.tolist() == [0, 1, 17, 7, 8, 15, 31, 16 + 9]
    causal = network.relative_position_bucket(np.array([0, -3, 3, -40]), bidirectional=False)
    # unidirectional: future keys clip to 0; 16 exact buckets; 40 -> 16 + int(log(2.5)/log(8)*16) = 23
    assert causal.tolist() == [0, 3, 0, 23]


def test_decoder_is_causal_and_encoder_ignores_padding():
    cfg = network.make_config("micro", vocab_size=40)
    model, params = _init(cfg)
    rng = np.random.default_rng(0)
    enc = jnp.asarray(rng.integers(3, 40, (2, 6)), jnp.int32)
    dec = jnp.asarray(rng.integers(3, 40, (2, 5)), jnp.int32)
    apply = lambda e, d: model.apply({"params": params}, e, d, d, enable_dropout=False)
    base = apply(enc, dec)
    dec2 = dec.at[:, 3].set(7)
    changed = apply(enc, dec2)
    np.testing.assert_array_equal(base[:, :3], changed[:, :3])
    assert not np.allclose(base[:, 3:], changed[:, 3:])
    # Padding appended to the encoder input changes nothing at real positions.
    padded = apply(jnp.pad(enc, ((0, 0), (0, 4))), dec)
    np.testing.assert_allclose(padded, base, atol=1e-5)


def test_packed_segments_equal_separate_runs():
    cfg = network.make_config("micro", vocab_size=40)
    model, params = _init(cfg)
    a_in, a_out = jnp.array([[5, 6, 7]]), jnp.array([[8, 9]])
    b_in, b_out = jnp.array([[10, 11]]), jnp.array([[12, 13, 14]])

    def single(x, y):
        y_in = jnp.pad(y[:, :-1], ((0, 0), (1, 0)))
        return model.apply({"params": params}, x, y_in, y, enable_dropout=False)

    enc = jnp.concatenate([a_in, b_in], 1)
    tgt = jnp.concatenate([a_out, b_out], 1)
    dec_in = jnp.array([[0, 8, 0, 12, 13]])
    logits = model.apply({"params": params}, enc, dec_in, tgt,
                         encoder_segment_ids=jnp.array([[1, 1, 1, 2, 2]]),
                         decoder_segment_ids=jnp.array([[1, 1, 2, 2, 2]]),
                         encoder_positions=jnp.array([[0, 1, 2, 0, 1]]),
                         decoder_positions=jnp.array([[0, 1, 0, 1, 2]]),
                         enable_dropout=False)
    np.testing.assert_allclose(logits[:, :2], single(a_in, a_out), atol=1e-5)
    np.testing.assert_allclose(logits[:, 2:], single(b_in, b_out), atol=1e-5)


def test_bad_preset_and_decode_without_length():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        network.make_config("huge", vocab_size=10)
    cfg = network.make_config("micro", vocab_size=10)
    model, params = _init(cfg)
    with pytest.raises(ValueError, match="max_decode_length"):
        model.apply({"params": params}, jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2), jnp.int32),
                    jnp.ones((1, 2), jnp.int32), enable_dropout=False, decode=True)


def test_cached_greedy_decoding_equals_uncached_and_teacher_forcing():
    from ntl_jax.train.evaluate import greedy_decode

    cfg = network.make_config("micro", vocab_size=40)
    model, params = _init(cfg)
    # Larger weights than at init so the argmax path is not trivially constant.
    params = jax.tree_util.tree_map(lambda x: x * 3.0, params)
    enc = jnp.asarray(np.random.default_rng(1).integers(2, 40, (4, 6)), jnp.int32)
    cached = greedy_decode(model, params, enc, 7, use_cache=True)
    uncached = greedy_decode(model, params, enc, 7, use_cache=False)
    np.testing.assert_array_equal(cached, uncached)
    # Teacher-forcing the decoded tokens reproduces them as the argmax (before any EOS).
    dec_in = jnp.pad(cached[:, :-1], ((0, 0), (1, 0)))
    logits = model.apply({"params": params}, enc, dec_in, jnp.ones_like(cached),
                         enable_dropout=False)
    first = np.asarray(jnp.argmax(logits, -1))
    for row, ref in zip(np.asarray(cached), first):
        n = list(row).index(1) + 1 if 1 in row else len(row)
        np.testing.assert_array_equal(row[:n], ref[:n])
