import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import NumberTokens, losses, number_token_loss
from ntl_jax._core.number_tokens import squash_distances

PIECES = ["<pad>", "</s>", "12", "-1", "3.5", "07", "▁4", "nan", "inf", "4", ".", "x", "1e3", " 5"]


def test_digit_level_keeps_single_ascii_digits_only():
    nt = NumberTokens.from_pieces(PIECES + ["٣", "¹"])
    assert nt.ids.tolist() == [9]
    assert nt.number_values.tolist() == [4.0]
    assert nt.dot_id == 10
    assert nt.vocab_size == len(PIECES) + 2
    assert np.isnan(nt.values[[0, 2, 3, 6, 7]]).all() and nt.values[9] == 4.0


def test_non_digit_level_takes_every_finite_float():
    nt = NumberTokens.from_pieces(PIECES, digit_level=False)
    # "▁4" does not parse, nan/inf are not finite; " 5" parses (Python float strips spaces, as ntloss).
    assert dict(zip(nt.ids.tolist(), nt.number_values.tolist())) == {
        2: 12.0, 3: -1.0, 4: 3.5, 5: 7.0, 9: 4.0, 12: 1000.0, 13: 5.0}


def test_distance_table_plain_and_squashed():
    nt = NumberTokens.from_pieces(["a"] + list("0123"))
    np.testing.assert_allclose(nt.distance_table(), np.abs(np.arange(4)[:, None] - np.arange(4)[None]))
    # squash 5: closest wrong (1) costs 1, farthest (3) costs 5, linear between, diagonal 0.
    np.testing.assert_allclose(
        squash_distances(nt, nt.distance_table(), 5.0),
        [[0, 1, 3, 5], [1, 0, 1, 3], [3, 1, 0, 1], [5, 3, 1, 0]])
    # NTL-WAS with squash_factor reads these costs: sure of "3", target "0": 5.
    logits = jnp.log(jax.nn.one_hot(jnp.asarray([[4]]), 5) + 1e-30)
    got = number_token_loss(logits, jnp.asarray([[1]]), nt, number_loss=losses.was(squash_factor=5.0))
    np.testing.assert_allclose(got, [[5.0]], rtol=1e-6)


@pytest.mark.parametrize("bad,error,message", [
    (1.0, ValueError, "expected squash_factor finite and > 1, got 1.0"),
    (0.5, ValueError, "expected squash_factor finite and > 1, got 0.5"),
    ("2", TypeError, "expected squash_factor to be a Python number, got str '2'"),
    (True, TypeError, "expected squash_factor to be a Python number, got bool True"),
])
def test_bad_squash_factor(bad, error, message):
    with pytest.raises(error) as info:
        losses.was(squash_factor=bad)
    assert str(info.value) == f"number loss 'was': {message}"
    # The table squashes as NTL-WAS charges, so it refuses what `was` refuses, and a table
    # whose closest and farthest wrong tokens coincide.
    with pytest.raises(error) as info:
        NumberTokens.from_pieces(["a", "0", "1", "2"]).distance_table(squash_factor=bad)
    assert str(info.value) == f"number loss 'was': {message}"
    with pytest.raises(ValueError, match=r"at least 3 distinct values .* got values \[0.0, 1.0\]"):
        NumberTokens.from_pieces(["a", "0", "1"]).distance_table(squash_factor=3.0)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="at least one number token.*got none among 3"):
        NumberTokens.from_pieces(["a", "b", "12"])
    with pytest.raises(ValueError, match="non-number token.*all numbers"):
        NumberTokens.from_pieces(list("0123"))
    with pytest.raises(TypeError, match="strings.*int at id 1"):
        NumberTokens.from_pieces(["a", 3])
    with pytest.raises(TypeError, match="expected a vocabulary"):
        NumberTokens.from_vocabulary(type("V", (), {"vocab_size": 3})())


@pytest.mark.parametrize("pieces,options,hint", [
    # Multi-digit pieces only: digit_level=False finds them.
    (["<pad>", "12", "345", "-7", "a"], {}, "; digit_level=False would find 3 ('12', '345', '-7'). digit_level=False "
     "counts every piece that parses as a finite number"),
    # Space-marked digits: prefixed_numbers=True; with multi-digit ones, both options.
    (["<pad>", "▁3", "▁12", "a"], {}, "; prefixed_numbers=True would find 1 ('▁3'); digit_level=False with "
     "prefixed_numbers=True would find 2 ('▁3', '▁12')."),
    (["<pad>", "Ġ12", "Ġ345", "a"], {"digit_level": False}, "; prefixed_numbers=True would find 2 ('Ġ12', 'Ġ345'). "
     "prefixed_numbers=True also counts a number after one space marker"),
    (["<pad>", "▁12", "34", "a"], {"prefixed_numbers": True}, "; digit_level=False would find 2 ('▁12', '34')."),
    (["<pad>", "12", "▁3", "a", "b", "c"], {}, "; digit_level=False would find 1 ('12'); prefixed_numbers=True "
     "would find 1 ('▁3'); digit_level=False with prefixed_numbers=True would find 2 ('12', '▁3')."),
])
def test_no_number_token_error_names_the_options_that_would_find_some(pieces, options, hint):
    with pytest.raises(ValueError) as info:
        NumberTokens.from_pieces(pieces, **options)
    message = str(info.value)
    assert message.startswith(f"expected at least one number token in the vocabulary (a piece that is "
                              f"{'a finite number' if options.get('digit_level') is False else 'a single digit 0-9'}"
                              f"), got none among {len(pieces)} pieces; ")
    assert hint in message
    # Each option named finds what the hint says.
    for found in message.split("; ")[1:]:
        if " would find " in found:
            named, count = found.split(" would find ")
            named_options = dict(options, **{o.split("=")[0]: o.endswith("True") for o in named.split(" with ")})
            assert NumberTokens.from_pieces(pieces, **named_options).num_numbers == int(count.split(" ")[0])


def test_no_number_token_error_without_a_hint_when_no_option_helps():
    with pytest.raises(ValueError) as info:
        NumberTokens.from_pieces(["<pad>", "a", "▁", "1a"])
    assert str(info.value) == ("expected at least one number token in the vocabulary (a piece that is a single "
                               "digit 0-9), got none among 4 pieces")
    with pytest.raises(ValueError, match="got none among 3 pieces$"):  # every option on already
        NumberTokens.from_pieces(["<pad>", "a", "b"], digit_level=False, prefixed_numbers=True)


def test_from_vocabulary_duck_types():
    class Pieces:
        vocab_size = 4

        def id_to_piece(self, i):
            return ["a", "1", "▁2", "2"][i]

    class Decoding:
        vocab_size = 5

        def decode(self, ids):
            return ["", "", "7", "x", "."][ids[0]]

    class Processor:
        def get_piece_size(self):
            return 3

        def id_to_piece(self, i):
            return ["<pad>", "5", "6"][i]

    class SentencePieceLike:
        vocab_size = 5  # two extra ids beyond the processor's pieces
        tokenizer = Processor()

    assert NumberTokens.from_vocabulary(Pieces()).ids.tolist() == [1, 3]
    decoded = NumberTokens.from_vocabulary(Decoding())
    assert decoded.ids.tolist() == [2] and decoded.dot_id == 4
    assert NumberTokens.from_vocabulary(SentencePieceLike()).ids.tolist() == [1, 2]


def test_is_a_pytree_usable_inside_jit():
    nt = NumberTokens.from_pieces(["a"] + list("0123"))

    @jax.jit
    def largest_distance(table):
        return jnp.max(squash_distances(table, table.distance_table(), 4.0))

    assert float(largest_distance(nt)) == 4.0
    leaves, treedef = jax.tree_util.tree_flatten(nt)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.dot_id == nt.dot_id and rebuilt.ids.tolist() == [1, 2, 3, 4]


def test_logits_wider_than_the_table_treat_the_extra_ids_as_non_numbers():
    """A network's rounded-up vocabulary: ids beyond the table are no numbers, in every
    loss (the same value as on the table's own width when those logits are -inf)."""
    import jax.numpy as jnp

    from ntl_jax import cross_entropy_and_ntl, ntl_was

    nt = NumberTokens.from_pieces(["a", "1", ".", "2"])
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 3, 4)), jnp.float32)
    wide = jnp.concatenate([logits, jnp.full((2, 3, 2), -jnp.inf)], axis=-1)
    targets = jnp.array([[1, 3, 0], [3, 5, 1]])  # 5: an id of the wide output only
    np.testing.assert_allclose(ntl_was(wide, targets, nt, reweigh=True),
                               ntl_was(logits, jnp.where(targets < 4, targets, 0), nt, reweigh=True), rtol=1e-6)
    loss, parts = cross_entropy_and_ntl(wide.at[..., 4:].set(0.0), targets, nt)
    assert np.isfinite(float(loss)) and float(parts["weight_sum"]) == 6.0
    with pytest.raises(ValueError, match=r"last axis >= the vocabulary size of number_tokens \(4\), got 3"):
        ntl_was(logits[..., :3], targets, nt)



def test_digit_counts_count_the_digits_of_plain_digit_runs_only():
    """`digit_counts` says how many digits a number token writes: leading zeros count,
    a sign, point or exponent makes the token no digit run (0), non-numbers are 0."""
    pieces = ["<pad>", "7", "07", "007", "123", "-1", "3.5", "1e3", "a", "."]
    nt = NumberTokens.from_pieces(pieces, digit_level=False)
    assert np.asarray(nt.digit_counts).tolist() == [0, 1, 2, 3, 3, 0, 0, 0, 0, 0]
    assert np.asarray(nt.number_values).tolist() == [7.0, 7.0, 7.0, 123.0, -1.0, 3.5, 1000.0]
    digits = NumberTokens.from_pieces(pieces, digit_level=True)
    assert np.asarray(digits.digit_counts).tolist() == [0, 1] + [0] * 8


def test_from_tokenizer_duck_types_each_api_and_fills_holes():
    """The three tokenizer APIs give one piece per id, holes are no numbers, and the
    `from_vocabulary` objects still work."""

    class HuggingFace:  # transformers: len() counts added tokens; id 3 is a hole
        vocab_size = 3

        def __len__(self):
            return 5

        def get_vocab(self):
            return {"a": 0, "12": 1, "Ġ7": 2, "<s>": 4, "9": 5}

        def convert_ids_to_tokens(self, ids):
            table = {v: k for k, v in self.get_vocab().items()}
            return [table.get(i) for i in ids]

    class Tokenizers:  # tokenizers.Tokenizer
        def get_vocab_size(self, with_added_tokens=True):
            return 4 if with_added_tokens else 3

        def id_to_token(self, i):
            return ["x", "3", None, "▁4"][i]

    class Processor:  # sentencepiece
        def get_piece_size(self):
            return 3

        def id_to_piece(self, i):
            return ["<unk>", "▁12", "07"][i]

    class Pieces:  # a from_vocabulary object
        vocab_size = 3

        def id_to_piece(self, i):
            return ["a", "5", "."][i]

    hf = NumberTokens.from_tokenizer(HuggingFace(), digit_level=False)
    # One past the largest id (5), not len() = 5, since id 3 is a hole.
    assert hf.vocab_size == 6 and hf.ids.tolist() == [1, 5] and hf.number_values.tolist() == [12.0, 9.0]
    hf_prefixed = NumberTokens.from_tokenizer(HuggingFace(), digit_level=False, prefixed_numbers=True)
    assert hf_prefixed.ids.tolist() == [1, 2, 5] and hf_prefixed.number_values.tolist() == [12.0, 7.0, 9.0]
    assert np.asarray(hf_prefixed.digit_counts).tolist() == [0, 2, 1, 0, 0, 1]
    digits = NumberTokens.from_tokenizer(HuggingFace(), prefixed_numbers=True)
    assert digits.ids.tolist() == [2, 5]  # "Ġ7" is a digit after its prefix, "12" is no digit

    tk = NumberTokens.from_tokenizer(Tokenizers())
    assert tk.vocab_size == 4 and tk.ids.tolist() == [1]
    assert NumberTokens.from_tokenizer(Tokenizers(), prefixed_numbers=True).ids.tolist() == [1, 3]

    sp = NumberTokens.from_tokenizer(Processor(), digit_level=False)
    assert sp.ids.tolist() == [2] and np.asarray(sp.digit_counts).tolist() == [0, 0, 2]
    sp_prefixed = NumberTokens.from_tokenizer(Processor(), digit_level=False, prefixed_numbers=True)
    assert sp_prefixed.number_values.tolist() == [12.0, 7.0]

    vocab = NumberTokens.from_tokenizer(Pieces())
    assert vocab.ids.tolist() == [1] and vocab.dot_id == 2


def test_prefixed_numbers_strip_one_marker_and_leave_the_dot_alone():
    pieces = ["a", "Ġ.", ".", "▁▁3", "▁", "Ġ-1", "Ġnan", " 5", "Ġ07"]
    nt = NumberTokens.from_pieces(pieces, digit_level=False, prefixed_numbers=True)
    assert nt.dot_id == 2  # "Ġ." is no dot
    assert dict(zip(nt.ids.tolist(), nt.number_values.tolist())) == {5: -1.0, 7: 5.0, 8: 7.0}
    assert np.asarray(nt.digit_counts).tolist() == [0] * 7 + [1, 2]
    plain = NumberTokens.from_pieces(pieces, digit_level=False)
    # Without the option only " 5" counts (Python's float strips spaces, as in ntloss), writing no plain digit run.
    assert plain.ids.tolist() == [7] and np.asarray(plain.digit_counts).tolist() == [0] * 9


@pytest.mark.parametrize("bad,hint", [
    (object(), "got object"),
    (type("EncodeOnly", (), {"encode": lambda self, s: [0]})(), "got EncodeOnly"),
    (type("SizeMethod", (), {"vocab_size": lambda self: 3, "decode": lambda self, i: "1"})(), "got SizeMethod"),
    ("tokenizer.json", "Tokenizer.from_file"),
    (["a", "1"], "from_pieces"),
])
def test_from_tokenizer_without_a_usable_api_is_a_type_error(bad, hint):
    with pytest.raises(TypeError, match=r"expected a tokenizer with `convert_ids_to_tokens`.*" + hint):
        NumberTokens.from_tokenizer(bad)


def test_a_vocabulary_with_its_own_number_tokens_gives_them():
    from ntl_jax.data import rt_vocabulary

    rt = rt_vocabulary.vocabulary()
    table = NumberTokens.from_vocabulary(rt)
    assert table is rt.number_tokens() and table.num_numbers == 550

    class Wrong:
        vocab_size = 3

        def number_tokens(self):
            return {"0": 0}

    with pytest.raises(TypeError, match=r"Wrong.number_tokens\(\) to return NumberTokens, got dict"):
        NumberTokens.from_vocabulary(Wrong())
