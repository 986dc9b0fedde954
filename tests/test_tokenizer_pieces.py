"""NumberTokens.from_tokenizer on LLM-style tokenizers built in memory (tests/tokenizer_builders.py).

Expected tables come from the builders' own vocabulary (plain Python, ids known before
the tokenizer exists) or from the tokenizer's `piece_to_id`, never from the code under
test; the ntloss checks build ntloss 0.3.2's table and losses from the same
`PreTrainedTokenizerFast`.
"""

import doctest
import itertools

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import ntl_jax
import ntl_jax._core.tokenizer_pieces
from ntl_jax import NumberTokens
from tests import tokenizer_builders as builders

QUESTION = "What is 123 * 45?"


def table(nt):
    """{id: (value, digit count)} of the number tokens."""
    values, counts = np.asarray(nt.values), np.asarray(nt.digit_counts)
    return {int(i): (float(values[i]), int(counts[i])) for i in np.asarray(nt.ids)}


def read_numbers(ids, tokens, nt):
    """The numbers a token sequence writes, read with the table: adjacent number tokens
    join (the earlier ones shifted by the later ones' digit counts) unless the later one
    starts with a space marker."""
    values, counts = np.asarray(nt.values, np.float64), np.asarray(nt.digit_counts)
    numbers, joined = [], False
    for i, token in zip(ids, tokens):
        if np.isnan(values[i]):
            joined = False
        elif joined and token[:1] not in "Ġ▁":
            numbers[-1] = numbers[-1] * 10.0 ** counts[i] + values[i]
        else:
            numbers.append(values[i])
            joined = True
    return numbers


def test_byte_alphabet_is_the_one_tokenizers_uses():
    from tokenizers import pre_tokenizers

    assert sorted(builders.bytes_to_unicode().values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert builders.bytes_to_unicode()[ord(" ")] == "Ġ" and builders.bytes_to_unicode()[ord("\n")] == "Ċ"


def test_tokenizer_pieces_docstring_examples():
    result = doctest.testmod(ntl_jax._core.tokenizer_pieces)
    assert result.attempted > 0 and result.failed == 0


def test_llama3_style_table_has_every_number_up_to_999_with_its_digits():
    tokenizer = builders.llama3_style()
    vocab = builders.byte_level_vocab(builders.LLAMA3_NUMBERS)
    nt = NumberTokens.from_tokenizer(tokenizer, digit_level=False)
    assert nt.vocab_size == len(vocab) + len(builders.SPECIAL_TOKENS) == 1358
    # "0".."9" at their byte values, "00".."99" and "000".."999" (leading zeros kept) from 256 on.
    expected = {vocab[p]: (float(int(p)), len(p)) for p in builders.LLAMA3_NUMBERS}
    assert table(nt) == expected and nt.num_numbers == 1110
    assert table(nt)[479] == (123.0, 3) and table(nt)[vocab["07"]] == (7.0, 2) and table(nt)[vocab["007"]] == (7.0, 3)
    assert sorted(set(np.asarray(nt.number_values).tolist())) == [float(v) for v in range(1000)]
    assert nt.dot_id == ord(".")
    # Nothing carries a prefix here, so the rule changes nothing.
    assert table(NumberTokens.from_tokenizer(tokenizer, digit_level=False, prefixed_numbers=True)) == expected
    digits = NumberTokens.from_tokenizer(tokenizer)
    assert table(digits) == {48 + d: (float(d), 1) for d in range(10)}


def test_llama3_style_encodings_read_back_their_numbers():
    tokenizer = builders.llama3_style()
    nt = NumberTokens.from_tokenizer(tokenizer, digit_level=False)
    question = tokenizer.encode(QUESTION)
    assert [t for t in question.tokens if t[0].isdigit()] == ["123", "45"]
    assert read_numbers(question.ids, question.tokens, nt) == [123.0, 45.0]
    # Groups of three from the left: "100" "07", "202" "4", "123" "456" "7", "007".
    longer = tokenizer.encode("10007 2024 1234567 007")
    assert [t for t in longer.tokens if t[0].isdigit()] == ["100", "07", "202", "4", "123", "456", "7", "007"]
    assert read_numbers(longer.ids, longer.tokens, nt) == [10007.0, 2024.0, 1234567.0, 7.0]


def test_qwen_style_splits_every_digit():
    tokenizer = builders.qwen_style()
    for digit_level, prefixed in itertools.product([True, False], [True, False]):
        nt = NumberTokens.from_tokenizer(tokenizer, digit_level=digit_level, prefixed_numbers=prefixed)
        assert table(nt) == {48 + d: (float(d), 1) for d in range(10)} and nt.vocab_size == 258
    question = tokenizer.encode(QUESTION)
    assert [t for t in question.tokens if t.isdigit()] == ["1", "2", "3", "4", "5"]
    assert read_numbers(question.ids, question.tokens, nt) == [123.0, 45.0]


def test_gpt2_style_prefixed_numbers_both_ways():
    tokenizer = builders.gpt2_style()
    vocab = builders.byte_level_vocab(builders.GPT2_EXTRA)
    digits = {48 + d: (float(d), 1) for d in range(10)}
    plain = {vocab[p]: (float(p), len(p)) for p in ("12", "123", "45", "07")}
    prefixed = {vocab[p]: (float(p[1:]), len(p) - 1) for p in ("Ġ1", "Ġ12", "Ġ123", "Ġ4", "Ġ45", "Ġ0", "Ġ07", "Ġ7")}
    assert table(NumberTokens.from_tokenizer(tokenizer, digit_level=False)) == {**digits, **plain}
    with_prefix = NumberTokens.from_tokenizer(tokenizer, digit_level=False, prefixed_numbers=True)
    assert table(with_prefix) == {**digits, **plain, **prefixed}
    assert table(with_prefix)[vocab["Ġ07"]] == (7.0, 2)
    # Digit level: "Ġ7" is a digit after its prefix; multi-digit pieces never count.
    single = {vocab[p]: (float(p[1:]), 1) for p in ("Ġ1", "Ġ4", "Ġ0", "Ġ7")}
    assert table(NumberTokens.from_tokenizer(tokenizer, prefixed_numbers=True)) == {**digits, **single}
    assert table(NumberTokens.from_tokenizer(tokenizer)) == digits

    question = tokenizer.encode(QUESTION)
    assert "Ġ123" in question.tokens and "Ġ45" in question.tokens
    assert read_numbers(question.ids, question.tokens, with_prefix) == [123.0, 45.0]
    default = NumberTokens.from_tokenizer(tokenizer, digit_level=False)
    assert read_numbers(question.ids, question.tokens, default) == []


def test_sentencepiece_prefixed_pieces_both_ways():
    pytest.importorskip("sentencepiece")
    processor = builders.sentencepiece_processor()
    unk = processor.unk_id()
    ids = {p: processor.piece_to_id(p) for p in ("▁12", "▁7", "▁45", "3", "<pad>", "<unk>", "<s>", "</s>")}
    assert all(i != unk for p, i in ids.items() if p != "<unk>"), ids
    nt = NumberTokens.from_tokenizer(processor, digit_level=False)
    assert nt.vocab_size == processor.get_piece_size() == 400
    assert np.isnan(np.asarray(nt.values)[[ids["▁12"], ids["▁7"], ids["▁45"]]]).all()
    assert table(nt)[ids["3"]] == (3.0, 1)
    assert np.isnan(np.asarray(nt.values)[[0, 1, 2, 3]]).all()  # pad, unk, bos, eos
    with_prefix = NumberTokens.from_tokenizer(processor, digit_level=False, prefixed_numbers=True)
    assert table(with_prefix)[ids["▁12"]] == (12.0, 2) and table(with_prefix)[ids["▁45"]] == (45.0, 2)
    assert table(with_prefix)[ids["3"]] == (3.0, 1)
    # Every piece the prefix turns into a number, and only those, is new.
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    gained = {i for i, p in enumerate(pieces) if p.startswith("▁") and p[1:].isdigit() and p[1:].isascii()}
    assert set(table(with_prefix)) - set(table(nt)) == gained and len(gained) > 50
    digits = NumberTokens.from_tokenizer(processor, prefixed_numbers=True)
    assert table(digits)[ids["▁7"]] == (7.0, 1) and ids["▁12"] not in table(digits)

    tokens = processor.encode(QUESTION, out_type=str)
    question = processor.encode(QUESTION)
    assert tokens[:4] == ["▁What", "▁is", "▁12", "3"]  # 123 is a prefixed piece and a digit
    assert read_numbers(question, tokens, with_prefix) == [123.0, 45.0]


def test_transformers_fast_covers_added_tokens():
    pytest.importorskip("transformers")
    tokenizer = builders.transformers_fast(builders.llama3_style())
    assert tokenizer.vocab_size == 1356 and len(tokenizer) == 1360
    assert tokenizer.add_tokens(["1000"]) == 1
    thousand = tokenizer.convert_tokens_to_ids("1000")
    assert thousand == 1360 and len(tokenizer) == 1361
    nt = NumberTokens.from_tokenizer(tokenizer, digit_level=False)
    vocab = builders.byte_level_vocab(builders.LLAMA3_NUMBERS)
    expected = {vocab[p]: (float(int(p)), len(p)) for p in builders.LLAMA3_NUMBERS}
    assert nt.vocab_size == 1361 and table(nt) == {**expected, thousand: (1000.0, 4)}
    specials = tokenizer.convert_tokens_to_ids([*builders.SPECIAL_TOKENS, "<|eot_id|>", "<|pad|>"])
    assert sorted(specials) == [1356, 1357, 1358, 1359] and np.isnan(np.asarray(nt.values)[specials]).all()
    encoded = tokenizer(QUESTION)["input_ids"]
    assert read_numbers(encoded, tokenizer.convert_ids_to_tokens(encoded), nt) == [123.0, 45.0]


def test_a_tokenizer_without_a_usable_api_is_a_type_error():
    with pytest.raises(TypeError, match=r"expected a tokenizer with .*got Encoding"):
        NumberTokens.from_tokenizer(builders.llama3_style().encode(QUESTION))


# -- parity with ntloss on the multi-digit vocabulary ---------------------------------

PARITY_VARIANTS = [
    *[("was", dict(digit_level=d, squash_factor=s, reweigh=r))
      for d, s, r in itertools.product([False, True], [None, 3.0], [False, True])],
    *[(loss, dict(digit_level=d, reweigh=r))
      for d, loss, r in itertools.product([False, True], ["mse", "mae", "huber"], [False, True])],
    *[("number_level", dict(float_level=f, reweigh=r)) for f, r in itertools.product([False, True], [False, True])],
]
PARITY_IDS = ["-".join([kind] + [f"{k}={v}" for k, v in opts.items()]) for kind, opts in PARITY_VARIANTS]
TEXTS = ["What is 123 * 45?", "10007 - 2024 = 7983.5", "Let x be 0.07 + 999", "1 + 2 = 3, 9 - 8 = 1.5 * 6 + 24"]
IGNORE = -100


@pytest.fixture(scope="module")
def parity_setup():
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    pytest.importorskip("ntloss")
    tokenizer = builders.transformers_fast(builders.llama3_style())
    tokenizer.add_tokens(["1000"])  # an added number token beyond vocab_size
    encoded = [tokenizer(t)["input_ids"] for t in TEXTS]
    length = max(map(len, encoded))
    targets = np.full((len(TEXTS), length), IGNORE, np.int64)
    for row, ids in enumerate(encoded):
        targets[row, : len(ids)] = ids
    targets[1, 0] = tokenizer.convert_tokens_to_ids("1000")
    logits = (np.random.default_rng(0).normal(size=(*targets.shape, len(tokenizer))) * 3).astype(np.float32)
    return tokenizer, logits, targets


def _ntloss_object(kind, options, tokenizer):
    import ntloss
    import torch.nn.functional as F

    if kind == "was":
        return ntloss.NTLoss(tokenizer, **options)
    if kind == "number_level":
        return ntloss.NumberLevelLoss(tokenizer, **options)
    fn = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}[kind]
    return ntloss.NTLossDotProduct(tokenizer, loss_function=fn, **options)


@pytest.mark.parametrize("kind,options", PARITY_VARIANTS, ids=PARITY_IDS)
def test_parity_with_ntloss_on_a_llama3_style_tokenizer(parity_setup, kind, options):
    import jax.numpy as jnp
    import torch

    tokenizer, logits, targets = parity_setup
    size = len(tokenizer)
    reference = _ntloss_object(kind, options, tokenizer)
    assert len(tokenizer) == size, "ntloss must not add tokens to this vocabulary"
    opts = dict(options)
    nt = NumberTokens.from_tokenizer(tokenizer, digit_level=opts.pop("digit_level", True))
    # The same table: ntloss parses get_vocab() with float, ours reads every id.
    np.testing.assert_array_equal(np.asarray(nt.values), reference.number_values.numpy())
    assert nt.num_numbers == (10 if options.get("digit_level", True) else 1111)
    is_number = ~np.isnan(np.asarray(nt.values)[np.maximum(targets, 0)]) & (targets != IGNORE)
    assert is_number.sum() >= 10 and (~is_number & (targets != IGNORE)).sum() >= 10
    for reduction in ("none", "mean"):
        expected = reference(torch.from_numpy(logits), torch.from_numpy(targets), reduction=reduction).numpy()
        args = (jnp.asarray(logits), jnp.asarray(targets, jnp.int32), nt)
        if kind == "was":
            got = ntl_jax.ntl_was(*args, reduction=reduction, **opts)
        elif kind == "number_level":
            got = ntl_jax.number_level_loss(*args, reduction=reduction, **opts)  # ntloss's float_level
        else:
            got = ntl_jax.ntl_dot(*args, loss_function=kind, reduction=reduction, **opts)
        got = np.asarray(got, np.float64)
        assert got.shape == expected.shape
        # float32 on both sides, summing over 1,111 number tokens in different orders. MSE of
        # values up to 999 reaches ~5e5 (an ulp ~0.03), so the bound is relative: measured
        # up to 1.1e-6 (~10 ulps); 1e-5 leaves room for torch's other SIMD kernels.
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert np.abs(expected).max() > 0.1
