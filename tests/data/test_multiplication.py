"""Multiplication problems: determinism, lengths, products, held-out split, metrics."""

import doctest
import math

import pytest

from ntl_jax.data import multiplication as mul


def _operands(question):
    a, b = question[len("What is "):-1].split(" * ")
    return int(a), int(b)


def test_deterministic_and_prefix_stable():
    for split in mul.SPLITS:
        first = mul.examples(split, 50, seed=3)
        assert first == mul.examples(split, 50, seed=3)
        assert mul.examples(split, 20, seed=3) == first[:20]
        assert mul.example(split, 3, 37) == first[37]
    assert mul.examples("train", 50, seed=4) != mul.examples("train", 50, seed=3)
    assert mul.examples("train", 0, seed=0) == []
    with pytest.raises(ValueError, match="split must be one of"):
        mul.examples("validation", 1, 0)


@pytest.mark.parametrize("split", mul.SPLITS)
def test_products_and_lengths(split):
    seen = set()
    for q, answer in mul.examples(split, 600, seed=1):
        a, b = _operands(q)
        assert a >= 1 and b >= 1
        assert answer == str(a * b)
        k, l = mul.operand_lengths(q)
        assert (k, l) == (len(str(a)), len(str(b)))
        seen.add((k, l))
        if split == "test_extrapolate":
            assert max(k, l) == 6 and min(k, l) >= 1
        else:
            assert 1 <= k <= 5 and 1 <= l <= 5
    expected = mul.EXTRAPOLATE_LENGTHS if split == "test_extrapolate" else mul.TRAIN_LENGTHS
    assert seen == set(expected)  # every length pair is drawn
    assert len(mul.EXTRAPOLATE_LENGTHS) == 11


def test_train_and_interpolation_test_are_disjoint():
    train = {_operands(q) for seed in (0, 1) for q, _ in mul.examples("train", 2000, seed)}
    test = {_operands(q) for q, _ in mul.examples("test_interpolate", 2000, seed=0)}
    assert not train & test
    assert not any(mul.is_held_out(a, b) for a, b in train)
    assert all(mul.is_held_out(a, b) for a, b in test)
    # about one pair in ten is held out, and the 81 one-digit pairs still have some
    frac = sum(mul.is_held_out(a, 7) for a in range(1000, 3000)) / 2000
    assert 0.07 < frac < 0.13
    assert 0 < len(mul._held_out_pairs(1, 1)) < 81
    ones = [q for q, _ in mul.examples("test_interpolate", 500, 0)
            if mul.operand_lengths(q) == (1, 1)]
    assert ones and all(mul.is_held_out(*_operands(q)) for q in ones)


def test_operand_lengths_rejects_other_text():
    assert mul.operand_lengths("What is 1 * 123456?") == (1, 6)
    with pytest.raises(ValueError, match="What is A \\* B"):
        mul.operand_lengths("What is 3 + 4?")


def test_metrics_hand_made():
    questions = ["What is 2 * 3?", "What is 4 * 5?", "What is 12 * 10?", "What is 11 * 11?"]
    targets = ["6", "20", "120", "121"]
    predictions = ["6", "25", "no idea", "-121"]
    m = mul.metrics(questions, targets, predictions)
    # errors: 0, 5/20, 1 (unparseable), 242/121
    assert m == {
        "mape": pytest.approx((0 + 0.25 + 1 + 2) / 4),
        "rel_error/k1_l1": pytest.approx(0.125),
        "accuracy/k1_l1": 0.5,
        "rel_error/k2_l2": pytest.approx(1.5),
        "accuracy/k2_l2": 0.0,
    }
    assert not any(math.isnan(v) for v in m.values())
    assert mul.metrics([], [], []) == {}
    # the last number of a prediction counts, as in ntl_jax.data.metrics
    assert mul.metrics(["What is 2 * 3?"], ["6"], ["2 * 3 = 6"])["accuracy/k1_l1"] == 1.0
    with pytest.raises(ValueError, match="as many"):
        mul.metrics(questions, targets, predictions[:2])
    with pytest.raises(ValueError, match="nonzero number"):
        mul.metrics(["What is 2 * 3?"], ["zero"], ["6"])


def test_docstring_examples():
    result = doctest.testmod(mul)
    assert result.attempted > 0 and result.failed == 0
