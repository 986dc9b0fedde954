"""Small stand-ins for the vocabulary and the generator, so trainer tests take seconds."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")


class CharVocabulary:
    """One id per character; 0 pad, 1 EOS, 2 unknown (the seqio conventions)."""

    chars = "0123456789+-. =?abcdefghijklmnopqrstuvwxyz"
    vocab_size = 3 + len(chars)

    def encode(self, text):
        return [3 + self.chars.index(c) if c in self.chars else 2 for c in text]

    def decode(self, ids):
        return "".join(self.chars[i - 3] for i in ids if 3 <= i < self.vocab_size)

    def id_to_piece(self, i):
        return ["<pad>", "</s>", "<unk>"][i] if i < 3 else self.chars[i - 3]


def addition_source(module, split, n, seed):
    """`examples(module, split, n, seed)` stand-in: two-term sums, larger when extrapolating."""
    rng = random.Random(f"{split}/{seed}")
    hi = 999 if split == "test_extrapolate" else 49
    out = []
    for _ in range(n):
        a, b = rng.randint(0, hi), rng.randint(0, hi)
        out.append((f"what is {a}+{b}?", str(a + b)))
    return out


@pytest.fixture
def vocabulary():
    return CharVocabulary()
