"""`ntl_from_number_logits` (NTL from the number tokens' columns alone, as the MaxText
integration computes it) equals `number_token_loss` on the whole logits, value and
gradient, for every number loss; tiktoken encodings give their pieces."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntl_jax
from ntl_jax import losses

PIECES = ["<pad>", "</s>", ".", "a", "-"] + list("0123456789") + ["12", "305"]


@pytest.fixture(scope="module")
def case():
    numbers = ntl_jax.NumberTokens.from_pieces(PIECES)
    logits = jax.random.normal(jax.random.PRNGKey(0), (3, 16, len(PIECES) + 3)) * 3  # a rounded-up vocabulary
    targets = jax.random.randint(jax.random.PRNGKey(1), (3, 16), 0, len(PIECES) + 3)
    digits = jax.random.randint(jax.random.PRNGKey(3), (3, 16), 5, 15)
    targets = jnp.where(jax.random.uniform(jax.random.PRNGKey(4), (3, 16)) < 0.5, digits, targets)
    weights = (jax.random.uniform(jax.random.PRNGKey(2), (3, 16)) > 0.2).astype(jnp.float32)
    return numbers, logits, targets, weights


@pytest.mark.parametrize("kind", losses.NAMES)
def test_the_columns_give_the_loss_and_gradient_of_the_whole_logits(case, kind):
    numbers, logits, targets, weights = case
    ids = jnp.asarray(numbers.ids)

    def whole(logits):
        return ntl_jax.number_token_loss(logits, targets, numbers, number_loss=kind, weights=weights, reduction="sum")

    def columns(number_logits):
        return ntl_jax.ntl_from_number_logits(number_logits, targets, numbers, number_loss=kind, weights=weights,
                                              reduction="sum")

    expected, expected_grad = jax.value_and_grad(whole)(logits)
    value, grad = jax.value_and_grad(columns)(logits[..., ids])
    assert float(expected) > 0
    np.testing.assert_allclose(float(value), float(expected), rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad[..., ids], rtol=1e-5, atol=1e-6)
    per_position = ntl_jax.ntl_from_number_logits(logits[..., ids], targets, numbers, number_loss=kind,
                                                  weights=weights)
    expected_per_position = ntl_jax.number_token_loss(logits, targets, numbers, number_loss=kind, weights=weights)
    np.testing.assert_allclose(per_position, expected_per_position, rtol=1e-5, atol=1e-6)


def test_what_ignored_positions_hold_reaches_neither_value_nor_gradient(case):
    numbers, logits, targets, weights = case
    columns = logits[..., jnp.asarray(numbers.ids)].at[:, :3].set(jnp.nan)
    masked = weights.at[:, :3].set(0.0)
    value, grad = jax.value_and_grad(lambda z: ntl_jax.ntl_from_number_logits(
        z, targets, numbers, weights=masked, reduction="sum"))(columns)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad))
    assert np.all(np.asarray(grad[:, :3]) == 0)


def test_columns_that_are_not_one_per_number_token_are_refused(case):
    numbers, logits, targets, _ = case
    with pytest.raises(ValueError, match=r"number_logits of shape \[batch, length, 10\].*got \(3, 16, 11\)"):
        ntl_jax.ntl_from_number_logits(logits[..., :11], targets, numbers)
    with pytest.raises(ValueError, match=r"targets of shape \(3, 16\).*got \(3, 15\)"):
        ntl_jax.ntl_from_number_logits(logits[..., :10], targets[:, :15], numbers)


class _Encoding:
    """The tiktoken.Encoding API: ids 0-3 ordinary tokens, 4 a hole, 5 a special token."""

    n_vocab = 6

    def decode_single_token_bytes(self, i):
        table = {0: b"12", 1: b" 7", 2: "\u00e9".encode()[:1], 3: b"305", 5: b"<|eot|>"}
        if i not in table:
            raise KeyError(i)
        return table[i]


def test_tiktoken_encodings_give_their_tokens_bytes_as_pieces():
    # As the same tokenizer's Hugging Face version writes them: a space is "Ġ", the byte
    # 0xC3 (half of "é") is "Ã".
    assert ntl_jax.tokenizer_pieces(_Encoding()) == ["12", "Ġ7", "Ã", "305", "", "<|eot|>"]
    numbers = ntl_jax.NumberTokens.from_tokenizer(_Encoding(), digit_level=False)
    assert numbers.ids.tolist() == [0, 3] and numbers.number_values.tolist() == [12.0, 305.0]
    prefixed = ntl_jax.NumberTokens.from_tokenizer(_Encoding(), digit_level=False, prefixed_numbers=True)
    assert prefixed.ids.tolist() == [0, 1, 3]


def test_the_byte_alphabet_is_the_one_tokenizers_writes():
    from ntl_jax._core.tokenizer_pieces import _byte_alphabet
    from tests import tokenizer_builders

    assert list(_byte_alphabet()) == [tokenizer_builders.bytes_to_unicode()[b] for b in range(256)]


def test_number_token_loss_takes_the_number_level_kinds_longest_number(case):
    numbers, logits, targets, weights = case
    got = {}
    for length in (1, 3):
        expected = ntl_jax.number_level_loss(logits, targets, numbers, weights=weights, max_number_length=length)
        got[length] = ntl_jax.number_token_loss(logits, targets, numbers, weights=weights,
                                                number_loss=losses.number_level(max_number_length=length))
        np.testing.assert_allclose(got[length], expected)
        # The same from the number tokens' columns, and from a spec.
        np.testing.assert_allclose(ntl_jax.ntl_from_number_logits(
            logits[..., jnp.asarray(numbers.ids)], targets, numbers, weights=weights,
            number_loss=f"number_level(max_number_length={length})"), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[1], got[3])  # the case has numbers of several digits
    with pytest.raises(ValueError, match=r"number loss 'number_level': expected max_number_length to be an integer "
                                         r">= 1, got 0"):
        ntl_jax.number_token_loss(logits, targets, numbers, number_loss="number_level(max_number_length=0)")
    with pytest.raises(TypeError, match=r"no longer takes max_number_length= .*"
                                        r"number_loss=ntl_jax.losses.number_level\(max_number_length=...\)"):
        ntl_jax.number_token_loss(logits, targets, numbers, number_loss="number_level", max_number_length=0)


def test_the_columns_alone_refuse_reweigh(case):
    # Reweighing reads the probability off the number tokens: the columns alone lack it.
    numbers, logits, targets, _ = case
    with pytest.raises(ValueError, match=r"number loss 'was\(reweigh=true\)': expected reweigh=False from the number "
                                         r"tokens' logits alone .*got reweigh=True"):
        ntl_jax.ntl_from_number_logits(logits[..., jnp.asarray(numbers.ids)], targets, numbers,
                                       number_loss=losses.was(reweigh=True))
