"""Digit-level seqio vocabularies: one token per digit, ten digit tokens, exact round trip."""

import io
import pickle

import numpy as np
import pytest

seqio = pytest.importorskip("seqio")
spm = pytest.importorskip("sentencepiece")
tf = pytest.importorskip("tensorflow")

from ntl_jax import NumberTokens  # noqa: E402
from ntl_jax.data.vocabulary import digit_token_ids  # noqa: E402
from ntl_jax.seqio import vocabularies  # noqa: E402

ANSWER = "-1747.09"
SAMPLE_TEXT = [
    "What is 0.09 + 1747?", "1747.09", "-1747.09", "What is 1402347 times 14?", "19632858",
    "Let x(g) = -g**3 + 2. Calculate x(-3).", "Solve 4*b + 10 - 44 = -3*g for b.",
    "Round 0.0000586 to 5 decimal places.", "What is 6/(-9) + 1/(16/(-24))?",
    "Is 5, 6 or 8 bigger?", "What is the third digit of 1234567890?",
]


@pytest.fixture(scope="module")
def merging_base(tmp_path_factory):
    """A T5-like SentencePiece model whose pieces merge digits ('747', '▁14', '.0'), with
    byte fallback (pieces like '<0x45>', which must never be split)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SAMPLE_TEXT * 20), model_writer=buf, vocab_size=400,
        model_type="bpe", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
        byte_fallback=True, minloglevel=2, num_threads=1)
    path = tmp_path_factory.mktemp("spm") / "merge.model"
    path.write_bytes(buf.getvalue())
    return seqio.SentencePieceVocabulary(str(path))


def _vocabularies(merging_base):
    return {
        "default": vocabularies.sentencepiece_vocabulary(),
        "default_extra_ids": vocabularies.sentencepiece_vocabulary(extra_ids=10),
        "byte": vocabularies.byte_vocabulary(),
        "split(merging sentencepiece)": vocabularies.DigitSplitVocabulary(merging_base),
        "split(default)": vocabularies.DigitSplitVocabulary(vocabularies.sentencepiece_vocabulary()),
        "split(byte)": vocabularies.DigitSplitVocabulary(seqio.ByteVocabulary()),
    }


def _pieces(v, ids):
    if hasattr(v, "id_to_piece"):
        return [v.id_to_piece(i) for i in ids]
    if isinstance(v, seqio.SentencePieceVocabulary):
        return [v.tokenizer.id_to_piece(i) for i in ids]
    return [v.decode([i]) for i in ids]


def test_the_base_model_merges_digits(merging_base):
    pieces = [merging_base.tokenizer.id_to_piece(i) for i in merging_base.encode(ANSWER + " times 14")]
    assert any(len(p.strip("▁")) > 1 and any(c.isdigit() for c in p) for p in pieces), pieces


@pytest.mark.parametrize("name", ["default", "default_extra_ids", "byte", "split(merging sentencepiece)",
                                  "split(default)", "split(byte)"])
def test_ten_digit_tokens_and_one_token_per_digit(merging_base, name):
    v = _vocabularies(merging_base)[name]
    nt = NumberTokens.from_vocabulary(v)
    assert nt.vocab_size == v.vocab_size
    assert len(nt.ids) == 10
    assert sorted(np.asarray(nt.number_values).tolist()) == list(range(10))
    ids = v.encode(ANSWER)
    values = np.asarray(nt.values)[ids]
    digits = [float(c) for c in ANSWER if c.isdigit()]
    assert values[~np.isnan(values)].tolist() == digits  # every digit is one number token
    assert [p for p in _pieces(v, ids) if any(c.isdigit() for c in p)] == [c for c in ANSWER if c.isdigit()]
    assert v.decode(ids) == ANSWER
    assert nt.dot_id is not None and nt.dot_id in ids


@pytest.mark.parametrize("name", ["default", "byte", "split(merging sentencepiece)", "split(default)"])
def test_round_trip_on_mathematics_text(merging_base, name):
    from ntl_jax.data import generate

    v = _vocabularies(merging_base)[name]
    texts = list(SAMPLE_TEXT)
    for module in ("arithmetic__add_sub_multiple", "algebra__linear_2d_composed",
                   "numbers__round_number", "polynomials__evaluate_composed"):
        for q, a in generate.examples(module, "train", 3):
            texts += [q, a]
    for t in texts:
        assert v.decode(v.encode(t)) == t
    if name == "split(merging sentencepiece)":
        # The text needed byte pieces and digit merges, and the wrapper split only the latter.
        base_ids = [i for t in texts for i in v.base.encode(t)]
        assert any(v.base.tokenizer.is_byte(i) for i in base_ids)
        assert all(len(v.id_to_piece(i)) == 1 for t in texts for i in v.encode(t)
                   if any(c.isdigit() for c in v.id_to_piece(i)) and not v.base.tokenizer.is_byte(i))


def test_tf_encoding_matches_python(merging_base):
    v = vocabularies.DigitSplitVocabulary(merging_base)
    assert v.encode_tf(tf.constant(ANSWER)).numpy().tolist() == v.encode(ANSWER)
    batch = v.encode_tf(tf.constant(["12 + 3", ANSWER]))
    assert batch.to_list() == [v.encode("12 + 3"), v.encode(ANSWER)]
    d = vocabularies.sentencepiece_vocabulary()
    assert d.encode_tf(tf.constant(ANSWER)).numpy().tolist() == d.encode(ANSWER)
    assert v.decode_tf(tf.constant(v.encode(ANSWER))).numpy().decode() == ANSWER


def test_wrapper_keeps_ids_special_tokens_and_pickles(merging_base):
    v = vocabularies.DigitSplitVocabulary(merging_base)
    assert (v.vocab_size, v.eos_id, v.unk_id, v.pad_id) == (merging_base.vocab_size, 1, 2, 0)
    # non-digit text is encoded exactly as the base does
    assert v.encode("times") == merging_base.encode("times")
    w = pickle.loads(pickle.dumps(v))
    assert w == v and w.encode(ANSWER) == v.encode(ANSWER)
    assert vocabularies.DigitSplitVocabulary(v) == v  # no double wrapping
    with pytest.raises(TypeError, match="expected a seqio.Vocabulary"):
        vocabularies.DigitSplitVocabulary("t5")
    with pytest.raises(ValueError, match="expected a token id"):
        v.id_to_piece(v.vocab_size)


def test_sentencepiece_vocabulary_special_ids_and_digit_ids():
    d = vocabularies.sentencepiece_vocabulary()
    assert (d.pad_id, d.eos_id, d.unk_id, d.bos_id) == (0, 1, 2, -1)
    assert digit_token_ids(d) == [d.tokenizer.piece_to_id(str(k)) for k in range(10)]
    assert digit_token_ids(vocabularies.byte_vocabulary()) == list(range(51, 61))


def test_docstring_examples():
    import doctest

    result = doctest.testmod(vocabularies)
    assert result.attempted > 0 and result.failed == 0


# ---- the Regression Transformer's vocabulary ------------------------------------------

def test_rt_vocabulary_is_the_trainers_in_python_and_in_tensorflow():
    from ntl_jax.data import rt_vocabulary as rt

    vocab, trainer = vocabularies.rt_vocabulary(), rt.vocabulary()
    assert vocab.vocab_size == trainer.vocab_size == 1550 and vocab.eos_id == 1 and vocab.pad_id == 0
    for text in SAMPLE_TEXT:
        ids = trainer.encode(text)
        assert vocab.encode(text) == ids
        assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == ids
        assert vocab.decode(ids) == trainer.decode(ids) == text  # digits kept as written
        assert vocab.decode_tf(tf.constant(ids)).numpy().decode() == text
        assert not set(ids) & set(digit_token_ids(trainer.base))  # no plain digit token left
    assert [vocab.id_to_piece(i) for i in vocab.encode("-12.5")] == ["▁-", "_1_1_", "_2_0_", "_5_-1_"]
    batch = vocab.encode_tf(tf.constant(SAMPLE_TEXT[:3]))
    assert batch.to_list() == [trainer.encode(t) for t in SAMPLE_TEXT[:3]]
    # A batch decodes through its first EOS, as seqio's vocabularies do.
    rows = [trainer.encode("3.25") + [1, 7, 7], trainer.encode("12") + [1, 0, 0]]
    rows[1] += [0] * (len(rows[0]) - len(rows[1]))
    assert vocab.decode_tf(tf.constant(rows)).numpy().tolist() == [b"3.25", b"12"]


def test_rt_number_tokens_value_each_digit_whatever_its_place():
    vocab = vocabularies.rt_vocabulary()
    numbers = vocab.number_tokens()
    ids = vocab.encode("905.1")
    assert [vocab.id_to_piece(i) for i in ids] == ["▁", "_9_2_", "_0_1_", "_5_0_", "_1_-1_"]
    assert list(np.asarray(numbers.values)[ids[1:]]) == [9, 0, 5, 1]
    assert np.isnan(np.asarray(numbers.values)[ids[0]])
    assert len(numbers.ids) == 550 and int(numbers.ids[0]) == vocab.vocab_size - 550


def test_rt_a_number_beyond_the_places_is_an_error_in_a_tf_data_pipeline_too():
    vocab = vocabularies.rt_vocabulary()
    too_long = "1" + "0" * 32  # 33 integer digits: places 32..0, the table's top is 31
    with pytest.raises(ValueError, match="RT places run 31..-23"):
        vocab.encode(too_long)
    dataset = tf.data.Dataset.from_tensor_slices([too_long]).map(vocab.encode_tf)
    with pytest.raises(tf.errors.InvalidArgumentError, match="RT places run 31..-23"):
        list(dataset)


def test_rt_vocabulary_pickles_and_compares_by_its_pieces():
    vocab = vocabularies.rt_vocabulary()
    again = pickle.loads(pickle.dumps(vocab))
    assert again == vocab and hash(again) == hash(vocab)
    assert again.encode("7.5") == vocab.encode("7.5")
    assert vocab != vocabularies.sentencepiece_vocabulary()
