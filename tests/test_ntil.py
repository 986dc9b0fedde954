"""NTIL (Fei et al., ACL 2025) against a plain rewrite of the authors' `ntil.py`
(tests/ntil_reference.py): per sequence, values and gradients, and its combination with
the cross-entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ntl_jax
from ntl_jax import losses
from tests import ntil_reference as ref

PIECES = ["<pad>", "</s>", "+", "=", "."] + list("0123456789")  # digit d has id d + 5
NT = ntl_jax.NumberTokens.from_pieces(PIECES)
V = len(PIECES)
PAD, EOS, PLUS, EQUALS, DOT = range(5)


def digits(text):
    """Token ids of `text` over PIECES ('_' is padding)."""
    table = {"_": PAD, "$": EOS, "+": PLUS, "=": EQUALS, ".": DOT} | {str(d): d + 5 for d in range(10)}
    return [table[c] for c in text]


# Each case a batch of rows of one length: numbers at the start and the end, numbers
# apart by one token, one-digit numbers, a long number, a row without any, padding.
ROWS = {
    "mixed": ["12+345=357$__", "7+8=15$______", "+=$__________", "9.25=0031+4$_"],
    "edges": ["1234567", "1+2+3+4", "$$$$$$$"],
    "long": ["1234567890+12=3$"],
}


def case(name, seed, right=0.0, scale=2.0):
    """Logits (`right`: the share of digit positions whose argmax is the target digit),
    targets and weights (0 at padding) of a case."""
    rows = ROWS[name]
    targets = np.array([digits(row) for row in rows])
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(targets.shape + (V,)) * scale
    hit = (targets >= 5) & (rng.random(targets.shape) < right)
    b, t = np.nonzero(hit)
    logits[b, t, targets[b, t]] = logits[b, t].max(axis=-1) + 1.0
    return logits.astype(np.float32), targets, (targets != PAD).astype(np.float32)


def reference(logits, targets, weights, dtype=torch.float64, **options):
    """`[batch]` NTIL per sequence and the gradient of their sum w.r.t. the logits."""
    z = torch.tensor(logits, dtype=dtype, requires_grad=True)
    digit = np.where((targets >= 5) & (weights > 0), targets - 5, -100)
    per_sequence = ref.ntil_per_sequence(z[..., 5:], torch.tensor(digit), **options)
    per_sequence.sum().backward()
    return per_sequence.detach().numpy(), z.grad.numpy()


def ours(logits, targets, weights, number_loss="ntil"):
    def total(x):
        return ntl_jax.number_token_loss(x, jnp.asarray(targets), NT, number_loss=number_loss,
                                         weights=jnp.asarray(weights), reduction="sum")

    per_position = ntl_jax.number_token_loss(jnp.asarray(logits), jnp.asarray(targets), NT, number_loss=number_loss,
                                             weights=jnp.asarray(weights))
    return np.asarray(per_position).sum(axis=-1), np.asarray(jax.grad(total)(jnp.asarray(logits)))


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.parametrize("right", [0.0, 0.7, 1.0], ids=["random", "mostly right", "all right"])
def test_each_sequence_equals_the_authors_ntil(name, right):
    logits, targets, weights = case(name, seed=len(name), right=right)
    want, want_grad = reference(logits, targets, weights, dtype=torch.float32)
    got, grad = ours(logits, targets, weights)
    assert np.any(want > 0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    # float32 both: tens of eps of the largest entry (place values reach 10^9 here).
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5 * np.abs(want_grad).max())


@pytest.mark.parametrize("options", [
    dict(digit_exp=1.0), dict(digit_alpha=0.5, abs_alpha=1.0, mag_alpha=0.0), dict(tau=0.5, mag_alpha=2.0),
], ids=str)
def test_its_parameters_are_the_authors(options):
    logits, targets, weights = case("mixed", seed=5, right=0.5)
    want, want_grad = reference(logits, targets, weights, constants_dtype=None, **options)
    got, grad = ours(logits, targets, weights, number_loss=losses.ntil(**options))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5 * np.abs(want_grad).max())


def test_with_cross_entropy_it_is_the_authors_combination():
    """`CE + stop_gradient(CE / NTIL) * 0.3 * NTIL`: the authors average NTIL over every
    sequence and CE over the real tokens; the rule makes the scale of NTIL cancel."""
    logits, targets, weights = case("mixed", seed=11, right=0.5)

    def objective(x):
        return ntl_jax.cross_entropy_and_ntl(x, jnp.asarray(targets), NT, number_loss="ntil", ntl_weight=0.3,
                                             weights=jnp.asarray(weights),
                                             loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")

    (loss, parts), grad = jax.value_and_grad(objective, has_aux=True)(jnp.asarray(logits))
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor(np.where(weights > 0, targets, -100))
    ce = torch.nn.functional.cross_entropy(z.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    digit = np.where((targets >= 5) & (weights > 0), targets - 5, -100)
    per_sequence = ref.ntil_per_sequence(z[..., 5:], torch.tensor(digit))
    want = ref.ntil_combined(ce, per_sequence.mean(), lam=0.3)
    want.backward()
    np.testing.assert_allclose(float(loss), float(want), rtol=2e-6)
    np.testing.assert_allclose(float(parts["ntl_term"]), 0.3 * float(ce), rtol=2e-6)
    # `ntl`: the mean over the sequences with a number (all but the third).
    np.testing.assert_allclose(float(parts["ntl"]), float(per_sequence[[0, 1, 3]].mean()), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(grad), z.grad.numpy(), rtol=1e-5, atol=1e-5 * z.grad.abs().max().item())


def test_added_as_it_is_when_asked():
    logits, targets, weights = case("mixed", seed=13)
    options = dict(weights=jnp.asarray(weights), ntl_weight=0.3)
    _, parts = ntl_jax.cross_entropy_and_ntl(jnp.asarray(logits), jnp.asarray(targets), NT,
                                             number_loss="ntil(combine=add)", **options)
    # Since 0.5.0: 0.3 * NTIL's mean over the sequences with a number (the authors' per sequence,
    # all but the third) * weight_sum / factor, the factor None (1), weight_sum the real targets'.
    per_sequence, _ = reference(logits, targets, weights)
    assert np.all(per_sequence[[0, 1, 3]] > 0) and per_sequence[2] == 0
    mean = per_sequence[[0, 1, 3]].mean()
    np.testing.assert_allclose(float(parts["ntl"]), mean, rtol=1e-6)
    np.testing.assert_allclose(float(parts["ntl_term"]), 0.3 * mean * weights.sum(), rtol=1e-6)


def test_no_number_adds_nothing_and_the_gradient_is_ce_alone():
    targets = np.array([digits("+=$__")])
    logits = np.random.default_rng(0).standard_normal((1, 5, V)).astype(np.float32)
    weights = (targets != PAD).astype(np.float32)

    def loss(number_loss):
        return jax.value_and_grad(lambda x: ntl_jax.cross_entropy_and_ntl(
            x, jnp.asarray(targets), NT, number_loss=number_loss, weights=jnp.asarray(weights))[0])(
            jnp.asarray(logits))

    (value, grad), (ce, ce_grad) = loss("ntil"), loss(None)
    assert float(value) == float(ce)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(ce_grad))


def test_a_table_of_multi_digit_tokens_is_refused_with_the_reason():
    wide = ntl_jax.NumberTokens.from_pieces(["<pad>", "7", "12", "3"], digit_level=False)
    with pytest.raises(ValueError, match=r"'ntil': expected number tokens that are the single digits 0-9.*\[12.0\]"):
        ntl_jax.number_token_loss(jnp.zeros((1, 2, 4)), jnp.array([[1, 2]]), wide, number_loss="ntil")


def test_it_is_one_value_with_a_spec():
    assert losses.parse("ntil") is losses.ntil()
    assert losses.ntil(combine="add", digit_exp=1.0).spec == "ntil(digit_exp=1.0, combine=add)"
    assert losses.parse("ntil(digit_exp=1.0, combine=add)") is losses.ntil(combine="add", digit_exp=1.0)
    loss = losses.ntil()
    assert (loss.across_positions, loss.combine, loss.default_weight) == (True, "scale_to_ce", 0.3)
    with pytest.raises(ValueError, match=r"'ntil': expected combine in \('add', 'scale_to_ce'\), got 'mul'"):
        losses.ntil(combine="mul")
    with pytest.raises(ValueError, match=r"'ntil': expected tau finite and > 0, got 0"):
        losses.ntil(tau=0)
