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


def fake_data(vocabulary, n=64, batch=8, seed=0):
    """Trainer data of `addition_source` problems ("fake" module), 8 per test split."""
    from ntl_jax.train import data as data_lib

    cfg = data_lib.DataConfig(module="fake", train_examples=n, eval_examples=8,
                              batch_size=batch, seed=seed)
    return data_lib.ProblemData(cfg, vocabulary=vocabulary, example_source=addition_source)


def micro_config(data, **overrides):
    """A `TrainConfig` of the micro preset on `data` that trains in seconds."""
    from ntl_jax.train import trainer

    base = dict(loss="ntl-was", preset="micro", steps=12, seed=3, learning_rate=3e-3,
                warmup_steps=2, log_every=2, checkpoint_every=4, eval_batch_size=8,
                data=data.config)
    return trainer.TrainConfig(**(base | overrides))


def first_step(vocabulary, loss, fused_loss=False, **options):
    """One step's metrics (on the host) from a fresh micro network, the logits it saw,
    its batch and its number tokens."""
    import jax

    from ntl_jax.train import network, optim, trainer
    from ntl_jax.train import step as step_lib

    data = fake_data(vocabulary, n=8, batch=8)
    model = network.Transformer(network.make_config("micro", vocabulary.vocab_size))
    nt = trainer.number_tokens_of(vocabulary)
    opt = optim.make_optimizer("adamw", learning_rate=1e-2, total_steps=10, warmup_steps=0)
    batch = data.batch(0)
    state = step_lib.create_train_state(model, opt, batch, seed=0)
    step = step_lib.make_train_step(model, opt, nt, loss=loss, fused_loss=fused_loss, **options)
    args, kwargs = step_lib.model_inputs(batch)
    logits = model.apply({"params": state.params}, *args, **kwargs, enable_dropout=False)
    return jax.device_get(step(state, batch)[1]), logits, batch, nt


@pytest.fixture
def vocabulary():
    return CharVocabulary()
