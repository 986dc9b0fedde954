"""The shipped vocabulary with sentencepiece alone: ten digit tokens, exact round trip,
seqio's decoding, and no TensorFlow or seqio imported by the trainer's modules."""

import json
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sentencepiece")

from ntl_jax import NumberTokens  # noqa: E402
from ntl_jax.data import vocabulary as vocab  # noqa: E402

ANSWER = "-1747.09"
REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE_TEXT = [
    "What is 0.09 + 1747?", "1747.09", "-1747.09", "What is 1402347 times 14?", "19632858",
    "Let x(g) = -g**3 + 2. Calculate x(-3).", "Solve 4*b + 10 - 44 = -3*g for b.",
    "Round 0.0000586 to 5 decimal places.", "What is 6/(-9) + 1/(16/(-24))?",
    "Is 5, 6 or 8 bigger?", "What is the third digit of 1234567890?",
]


def _mathematics_text():
    pytest.importorskip("mathematics_dataset")
    from ntl_jax.data import generate

    texts = list(SAMPLE_TEXT)
    for module in ("arithmetic__add_sub_multiple", "algebra__linear_2d_composed",
                   "numbers__round_number", "polynomials__evaluate_composed"):
        for q, a in generate.examples(module, "train", 3):
            texts += [q, a]
    return texts


def test_ten_digit_tokens_and_one_token_per_digit():
    v = vocab.default_vocabulary()
    nt = NumberTokens.from_vocabulary(v)
    assert nt.vocab_size == v.vocab_size == 1000
    assert len(nt.ids) == 10
    assert sorted(np.asarray(nt.number_values).tolist()) == list(range(10))
    ids = v.encode(ANSWER)
    assert all(isinstance(i, int) for i in ids)
    values = np.asarray(nt.values)[ids]
    assert values[~np.isnan(values)].tolist() == [float(c) for c in ANSWER if c.isdigit()]
    assert [v.id_to_piece(i) for i in ids] == ["▁-", "1", "7", "4", "7", ".", "0", "9"]
    assert v.decode(ids) == ANSWER
    assert nt.dot_id is not None and nt.dot_id in ids
    assert vocab.digit_token_ids(v) == [v.tokenizer.piece_to_id(str(k)) for k in range(10)]


def test_special_ids_and_pieces():
    v = vocab.default_vocabulary()
    assert (v.pad_id, v.eos_id, v.unk_id, v.bos_id) == (0, 1, 2, -1)
    assert [v.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    with pytest.raises(ValueError, match="expected a token id"):
        v.id_to_piece(v.vocab_size)


def test_round_trip_on_mathematics_text():
    v = vocab.default_vocabulary()
    for t in _mathematics_text():
        assert v.decode(v.encode(t)) == t


def test_decoding_the_trainers_outputs():
    """Padding, EOS and the ids a padded network vocabulary adds (here 1000..1023)."""
    v = vocab.default_vocabulary()
    ids = v.encode(ANSWER)
    assert v.decode(ids + [1] + v.encode(" 12") + [0, 0]) == ANSWER  # stops at the first EOS
    assert v.decode([0] + ids + [0]) == ANSWER  # pad decodes to nothing
    assert v.decode(np.asarray(ids + [1, 0], np.int32)) == ANSWER
    assert v.decode(ids + [1000, 1023]) == ANSWER + " ⁇  ⁇ "  # out of range: unknown (" ⁇ ")
    assert v.decode([v.unk_id]) == v.decode([1023])
    assert v.decode([]) == ""


def test_pickles_and_compares():
    v = vocab.default_vocabulary()
    v.encode(ANSWER)  # loads the processor, which pickles leave out
    w = pickle.loads(pickle.dumps(v))
    assert w == v and hash(w) == hash(v) and w.encode(ANSWER) == v.encode(ANSWER)
    assert vocab.default_vocabulary() == v


def test_matches_seqio_sentencepiece_vocabulary():
    pytest.importorskip("seqio")
    from ntl_jax.seqio import vocabularies

    v = vocab.default_vocabulary()
    s = vocabularies.sentencepiece_vocabulary()
    assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (s.vocab_size, s.pad_id, s.eos_id, s.unk_id)
    assert [v.id_to_piece(i) for i in range(v.vocab_size)] == [
        s.tokenizer.id_to_piece(i) for i in range(s.vocab_size)]
    rng = np.random.default_rng(0)
    for t in _mathematics_text():
        ids = v.encode(t)
        assert ids == list(s.encode(t))
        assert v.decode(ids) == s.decode(ids)
        # What a model emits: any ids of a network padded to 1024, with EOS and padding.
        noisy = ids + rng.integers(0, 1024, size=5).tolist() + [1, 5, 0]
        noisy[rng.integers(len(noisy))] = int(rng.integers(1000, 1024))
        assert v.decode(noisy) == s.decode(noisy)
        assert v.decode([i for i in noisy if i > 0]) == s.decode([i for i in noisy if i > 0])


TRAINER_MODULES = ["ntl_jax.data.vocabulary", "ntl_jax.train.trainer", "ntl_jax.train.data",
                   "ntl_jax.cli.train", "ntl_jax.cli.compare", "ntl_jax.cli"]


@pytest.mark.parametrize("module", TRAINER_MODULES)
def test_trainer_modules_import_neither_tensorflow_nor_seqio(module):
    code = ("import importlib, json, sys; importlib.import_module(sys.argv[1]); "
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('tensorflow', 'seqio'))))")
    out = subprocess.run([sys.executable, "-c", code, module], check=True, cwd=REPO,
                         capture_output=True, text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_default_vocabulary_loads_neither_tensorflow_nor_seqio():
    code = ("import json, sys; from ntl_jax.train import data; v = data.default_vocabulary(); "
            "v.decode(v.encode('What is 1 + 2?')); "
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('tensorflow', 'seqio'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                         capture_output=True, text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
