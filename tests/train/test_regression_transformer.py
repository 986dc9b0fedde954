"""The Regression Transformer baseline: the pieces file, encoding and decoding against the
authors' number regex, NTL-MSE on RT logits, and `train` / `compare` with "rt" and "rt+ntl-mse"."""

import importlib.util
import json
import os
import pathlib
import pickle
import random
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("sentencepiece")

from ntl_jax.data import rt_vocabulary as rt  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
BASE_SIZE = 1000  # the shipped SentencePiece vocabulary
# The authors' number regex (`abstract_tokenizer.NUMBER_REGEX`), on ASCII digits.
AUTHORS_NUMBER = re.compile(r"(\d+)(\.\d+)?", re.ASCII)
RT_PIECE = re.compile(r"_([0-9])_(-?[0-9]+)_")


@pytest.fixture(scope="module")
def vocab():
    return rt.vocabulary()


def _script():
    spec = importlib.util.spec_from_file_location("make_rt_vocab", REPO / "scripts" / "make_rt_vocab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _file_lines():
    return (REPO / "src" / "ntl_jax" / "data" / "vocab_assets" / "rt_number_tokens.txt").read_text().splitlines()


def reference_pieces(number: str) -> list[str]:
    """`_d_p_` of each digit of a number as written (the definition)."""
    whole, _, fraction = number.partition(".")
    return ([f"_{c}_{len(whole) - 1 - i}_" for i, c in enumerate(whole)]
            + [f"_{c}_{-1 - i}_" for i, c in enumerate(fraction)])


def rt_runs(pieces: list[str]) -> list[list[str]]:
    """Maximal runs of consecutive RT pieces."""
    runs, run = [], []
    for piece in pieces + [""]:
        if RT_PIECE.fullmatch(piece):
            run.append(piece)
        elif run:
            runs.append(run)
            run = []
    return runs


def rt_values(vocab, ids) -> list[Fraction]:
    """The numbers of the RT runs in `ids`: a run ends where a place does not decrease."""
    values, run = [], []
    for i in list(ids) + [-1]:
        m = RT_PIECE.fullmatch(vocab.id_to_piece(i)) if 0 <= i < vocab.vocab_size else None
        digit_place = (int(m.group(1)), int(m.group(2))) if m else None
        if run and (digit_place is None or digit_place[1] >= run[-1][1]):
            values.append(sum(d * Fraction(10) ** p for d, p in run))
            run = []
        if digit_place is not None:
            run.append(digit_place)
    return values


# ---- the pieces file ----------------------------------------------------------------------


def test_the_committed_pieces_file_is_what_the_script_writes(tmp_path):
    script = _script()
    committed = (REPO / "src" / "ntl_jax" / "data" / "vocab_assets" / "rt_number_tokens.txt").read_bytes()
    assert script.main(["--output", str(tmp_path / "rt.txt")]) == 0
    assert (tmp_path / "rt.txt").read_bytes() == committed
    lines = committed.decode().splitlines()
    assert len(lines) == 10 * (31 + 23 + 1) and lines[:2] == ["_0_31_", "_1_31_"] and lines[-1] == "_9_-23_"
    assert lines[10 * 31: 10 * 31 + 10] == [f"_{d}_0_" for d in range(10)]
    with pytest.raises(SystemExit):
        script.main(["--max-place", "-1", "--output", str(tmp_path / "bad.txt")])
    # a damaged file is refused, naming the file and the line
    swapped = lines[:]
    swapped[4], swapped[5] = swapped[5], swapped[4]
    (tmp_path / "swapped.txt").write_text("\n".join(swapped) + "\n")
    with pytest.raises(ValueError, match=r"swapped.txt, line 5: expected '_4_31_', got '_5_31_'"):
        rt.read_pieces(str(tmp_path / "swapped.txt"))
    (tmp_path / "short.txt").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match=r"short.txt: expected 550 lines for places 31..-23, got 549"):
        rt.read_pieces(str(tmp_path / "short.txt"))
    (tmp_path / "words.txt").write_text("hello\n")
    with pytest.raises(ValueError, match=r"words.txt: expected lines '_d_p_'.*got 'hello'"):
        rt.read_pieces(str(tmp_path / "words.txt"))


def test_ids_pieces_and_the_base_vocabulary(vocab):
    lines = _file_lines()
    assert vocab.vocab_size == BASE_SIZE + len(lines) == 1550
    assert [vocab.id_to_piece(BASE_SIZE + k) for k in range(len(lines))] == lines
    assert [vocab.id_to_piece(i) for i in (0, 1, 3, 12)] == ["<pad>", "</s>", "0", "9"]  # the base's ids unchanged
    assert (vocab.pad_id, vocab.eos_id) == (0, 1)
    for bad in (-1, 1550):
        with pytest.raises(ValueError, match=f"expected a token id in \\[0, 1550\\), got {bad}"):
            vocab.id_to_piece(bad)
    from ntl_jax.train import systems

    assert systems.vocabulary("rt") is vocab and systems.vocabulary("rt+ntl-mse") is vocab
    assert systems.vocabulary_name_of(vocab) == "rt"
    copy = pickle.loads(pickle.dumps(vocab))
    text = "What is -12.5 + 7?"
    assert copy.encode(text) == vocab.encode(text) and copy.decode(copy.encode(text)) == text


def test_docstring_examples():
    import doctest

    result = doctest.testmod(rt)
    assert result.attempted > 0 and result.failed == 0


def test_train_help_names_the_rt_systems(capsys):
    from ntl_jax import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    # argparse wraps at the terminal's width, also at hyphens ("rt+ntl-" / "mse"): compare
    # without whitespace.
    text = "".join(capsys.readouterr().out.split())
    assert "rt,rt+ntl-mse:theRegressionTransformer'snumbertokens" in text


def test_import_is_light():
    code = ("import sys, ntl_jax.data.rt_vocabulary as r; "
            "print(sorted(m for m in ('sentencepiece', 'flax', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- encoding and decoding ----------------------------------------------------------------


@pytest.mark.parametrize("text, pieces", [
    ("0", ["▁", "_0_0_"]),
    ("1747", ["▁", "_1_3_", "_7_2_", "_4_1_", "_7_0_"]),
    ("-12.5", ["▁-", "_1_1_", "_2_0_", "_5_-1_"]),  # the sign stays a token of its own
    ("0.05", ["▁", "_0_0_", "_0_-1_", "_5_-2_"]),
    ("1.50", ["▁", "_1_0_", "_5_-1_", "_0_-2_"]),  # digits as written
    ("What is 3 - -41.2?", ["▁What", "▁is", "▁", "_3_0_", "▁-", "▁-", "_4_1_", "_1_0_", "_2_-1_", "?"]),
    ("Let x = 5.", ["▁Let", "▁x", "▁=", "▁", "_5_0_", "."]),  # a point without digits after it ends the sentence
    ("x1.2.3", ["▁x", "_1_0_", "_2_-1_", ".", "_3_0_"]),  # as the regex: 1.2, then 3
])
def test_exact_tokens_of_hand_written_numbers(vocab, text, pieces):
    lines = _file_lines()
    ids = vocab.encode(text)
    assert [vocab.id_to_piece(i) for i in ids] == pieces
    # RT piece k of the file has id 1000 + k; the other ids are the base vocabulary's
    assert [i - BASE_SIZE for i, p in zip(ids, pieces) if RT_PIECE.fullmatch(p)] == [
        lines.index(p) for p in pieces if RT_PIECE.fullmatch(p)]
    assert all(i < BASE_SIZE for i, p in zip(ids, pieces) if not RT_PIECE.fullmatch(p))
    assert vocab.decode(ids) == text


def _generator_texts():
    pytest.importorskip("mathematics_dataset")
    from ntl_jax.data import generate
    from ntl_jax.train import data as data_lib

    module = "arithmetic__add_sub_multiple"
    sets = [(module, split, 200) for split in ("train",) + data_lib.eval_splits(module)]
    assert [s[1] for s in sets] == ["train", "test_interpolate", "test_extrapolate"]
    # long numbers: add_or_sub's extrapolation set has up to 20 integer digits and 20 decimals
    sets += [("arithmetic__add_or_sub", "test_extrapolate", 100), ("arithmetic__add_or_sub_in_base", "train", 100)]
    texts = []
    for name, split, n in sets:
        for q, a in generate.examples(name, split, n, 0):
            texts += [q, a]
    return texts


def test_round_trips_and_numbers_on_generator_text(vocab):
    base_digit_ids = {vocab.base.encode(str(d))[-1] for d in range(10)}
    texts = _generator_texts()
    longest = (0, 0)
    for text in texts:
        ids = vocab.encode(text)
        assert vocab.decode(ids) == text
        assert not base_digit_ids & set(ids), text  # no plain digit token is left
        numbers = [m.group(0) for m in AUTHORS_NUMBER.finditer(text)]
        pieces = [vocab.id_to_piece(i) for i in ids]
        assert rt_runs(pieces) == [reference_pieces(n) for n in numbers], text
        # one RT token per digit: the base's tokens less each number's decimal point
        assert len(ids) == len(vocab.base.encode(text)) - sum("." in n for n in numbers)
        for n in numbers:
            whole, _, fraction = n.partition(".")
            longest = (max(longest[0], len(whole)), max(longest[1], len(fraction)))
    assert longest == (19, 16)  # these 100 problems' most integer digits and decimals


def test_decoding_runs_of_rt_tokens(vocab):
    def ids(*digit_places):
        return [vocab.rt_id(d, p) for d, p in digit_places]

    assert vocab.decode(ids((1, 2), (5, 0))) == "105"  # a missing place is a 0
    assert vocab.decode(ids((5, -2))) == "0.05"
    assert vocab.decode(ids((1, 0), (2, 0))) == "1 2"  # a place not below the last one: a new number
    assert vocab.decode(ids((3, 1), (4, 0), (1, 1))) == "34 10"
    assert vocab.decode(ids((7, 0)) + [1] + ids((8, 0))) == "7"  # up to EOS
    assert vocab.decode([0] + ids((9, 0))) == "9"
    assert vocab.decode(np.array(vocab.encode("-3.25"))) == "-3.25"
    unk = vocab.base.decode([vocab.unk_id])
    assert vocab.decode([vocab.vocab_size + 3]) == unk  # a network's padded ids
    # any run with decreasing places reads sum d * 10^p
    rng = random.Random(0)
    for _ in range(300):
        places = sorted(rng.sample(range(-23, 32), rng.randint(1, 8)), reverse=True)
        run = [(rng.randint(0, 9), p) for p in places]
        assert Fraction(vocab.decode(ids(*run))) == sum(d * Fraction(10) ** p for d, p in run)


def test_numbers_beyond_the_places_are_an_error(vocab):
    assert vocab.decode(vocab.encode("9" * 32)) == "9" * 32
    assert vocab.id_to_piece(vocab.encode("9" * 32)[1]) == "_9_31_"
    assert vocab.decode(vocab.encode("0." + "1" * 23)) == "0." + "1" * 23
    message = "expected numbers of at most 32 integer digits and 23 decimals, got {}"
    with pytest.raises(ValueError, match=message.format("1" * 33)):
        vocab.encode("1" * 33)
    with pytest.raises(ValueError, match=message.format(r"0\." + "1" * 24)):
        vocab.encode("Round 0." + "1" * 24 + ".")
    with pytest.raises(ValueError, match="in 'What is 5 \\+ 1{40}\\?'"):
        vocab.encode("What is 5 + " + "1" * 40 + "?")


# ---- NTL ----------------------------------------------------------------------------------


def test_number_tokens_are_the_rt_pieces_valued_at_their_digit(vocab):
    from ntl_jax.train import trainer

    nt = vocab.number_tokens()
    lines = _file_lines()
    np.testing.assert_array_equal(nt.ids, np.arange(BASE_SIZE, BASE_SIZE + len(lines)))
    np.testing.assert_array_equal(nt.number_values, [float(piece[1]) for piece in lines])
    assert nt.vocab_size == 1550 and nt.dot_id is None
    values = np.asarray(nt.values)
    assert np.isnan(values[:BASE_SIZE]).all()  # the base's digit pieces are no number tokens
    np.testing.assert_array_equal(values[BASE_SIZE:], nt.number_values)
    assert trainer.number_tokens_of(vocab) is nt


def test_ntl_mse_on_rt_logits_against_numpy(vocab):
    import jax.numpy as jnp

    from ntl_jax import ntl_dot

    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, (2, 4, 1664)).astype(np.float32)  # the network's padded width
    targets = np.array([[vocab.rt_id(7, 3), vocab.rt_id(7, -1), vocab.base.encode("2")[-1], 1],
                        [vocab.rt_id(0, 0), vocab.rt_id(9, 12), 0, 0]])
    got = np.asarray(ntl_dot(jnp.asarray(logits), jnp.asarray(targets), vocab.number_tokens(),
                              loss_function="mse"))
    expected = np.zeros((2, 4))
    digits = np.arange(550) % 10
    for b, t, y in [(0, 0, 7), (0, 1, 7), (1, 0, 0), (1, 1, 9)]:
        z = logits[b, t, BASE_SIZE:BASE_SIZE + 550].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        expected[b, t] = (p @ digits - y) ** 2
    # float32 softmax over 550 logits: relative error ~1e-6
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got[0, 2] == 0 and got[0, 3] == 0  # a base digit target is no number


# ---- the trainer ---------------------------------------------------------------------------

RUN = ["--preset", "micro", "--module", "arithmetic__add_sub_multiple", "--steps", "200", "--train-examples", "64",
       "--eval-examples", "8", "--batch-size", "8", "--learning-rate", "0.01", "--warmup-steps", "2",
       "--log-every", "1", "--checkpoint-every", "200", "--no-progress", "--no-tensorboard"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`ntl-jax train --loss rt` and `--loss rt+ntl-mse`, written where the compare below
    finds them (and reuses them: one training each)."""
    pytest.importorskip("mathematics_dataset")
    pytest.importorskip("orbax.checkpoint")
    from ntl_jax import cli
    from ntl_jax.cli import compare as cli_compare

    out = str(tmp_path_factory.mktemp("rt") / "cmp")
    argv = ["--losses", "ce", "rt", "rt+ntl-mse", "--seeds", "1", "--out", out] + RUN
    _, runs = cli_compare.plan(cli.build_parser(["compare"] + argv).parse_args(["compare"] + argv), out)
    dirs = {spec.loss: cli_compare.run_dir(out, spec) for spec in runs}
    # a system without NTL runs at weight 0 in compare
    assert cli.main(["train", "--loss", "rt", "--ntl-weight", "0", "--out", dirs["rt"]] + RUN) == 0
    assert cli.main(["train", "--loss", "rt+ntl-mse", "--out", dirs["rt+ntl-mse"]] + RUN) == 0
    return out, argv, dirs


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_train_rt_and_rt_ntl_mse(vocab, trained):
    import jax

    from ntl_jax.train import data as data_lib
    from ntl_jax.train import network, optim, trainer
    from ntl_jax.train import step as step_lib

    _, _, dirs = trained
    first = {loss: _metrics(dirs[loss])[0] for loss in ("rt", "rt+ntl-mse")}
    assert first["rt"]["step"] == 1
    # same seed, same RT batches, same initialisation: the same first cross-entropy
    assert first["rt"]["train/cross_entropy"] == first["rt+ntl-mse"]["train/cross_entropy"]
    for loss, weight in (("rt", 0.0), ("rt+ntl-mse", 0.3)):
        m = first[loss]
        assert m["train/loss"] == pytest.approx(m["train/cross_entropy"] + m["train/z_loss"] + m["train/ntl_term"],
                                                rel=1e-6)
        # since 0.5.0: lambda * the mean * weight_sum / factor (was: * ntl_weight_sum / factor)
        assert m["train/ntl_term"] == pytest.approx(weight * m["train/ntl"] * m["train/weight_sum"]
                                                    / m["train/loss_normalizing_factor"], rel=1e-6)
        info = json.load(open(os.path.join(dirs[loss], trainer.FINAL_PARAMS_INFO)))
        assert info["vocabulary"] == trainer.vocabulary_fingerprint(vocab)
        config = json.load(open(os.path.join(dirs[loss], "config.json")))
        assert config["loss"] == loss and config["ntl_weight"] == weight

    # Step 1's NTL-MSE (before any update) from the initial parameters, in numpy.
    config = json.load(open(os.path.join(dirs["rt+ntl-mse"], "config.json")))
    data = data_lib.ProblemData(data_lib.DataConfig(**config["data"]), vocabulary=vocab)
    model = network.make_model("encoder-decoder", network.make_config("micro", vocab.vocab_size), "rt")
    state = step_lib.create_train_state(model, optim.make_optimizer(total_steps=2), data.batch(0), config["seed"])
    assert state.params["token_embedder"]["embedding"].shape[0] == 1664  # 1550 rounded up to 128s
    batch = data.batch(0)
    args, kwargs = step_lib.model_inputs(batch)
    logits = np.asarray(jax.jit(lambda p: model.apply({"params": p}, *args, **kwargs, enable_dropout=False))(
        state.params), np.float64)
    targets = batch["decoder_target_tokens"]
    is_rt = targets >= BASE_SIZE
    z = logits[..., BASE_SIZE:BASE_SIZE + 550]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    yhat = p @ (np.arange(550) % 10)
    y = np.where(is_rt, (targets - BASE_SIZE) % 10, 0)
    m = first["rt+ntl-mse"]
    assert m["train/ntl_weight_sum"] == is_rt.sum() and m["train/weight_sum"] == (targets > 0).sum()
    # float32 network and fused loss: ~1e-6 relative
    # the mean over the RT number targets; what it adds to the loss: lambda * that mean (the
    # trainer's factor is NUM_REAL_TARGET_TOKENS, the real targets' count, so weight_sum / factor = 1)
    mse_mean = np.sum(np.where(is_rt, (yhat - y) ** 2, 0)) / is_rt.sum()
    assert m["train/loss_normalizing_factor"] == (targets > 0).sum()
    assert m["train/ntl"] == pytest.approx(mse_mean, rel=1e-4)
    assert m["train/ntl_term"] == pytest.approx(0.3 * mse_mean, rel=1e-4)


def _greedy_ids(vocab, run_dir, eval_sets_of):
    """`{split: [ids up to EOS]}` of a finished run's final parameters, decoded as its evaluation did."""
    import jax.numpy as jnp
    from flax import serialization

    from ntl_jax.train import evaluate, network

    with open(os.path.join(run_dir, "final_params.msgpack"), "rb") as f:
        params = serialization.msgpack_restore(f.read())
    model = network.make_model("encoder-decoder", network.make_config("micro", vocab.vocab_size), "rt")
    data, batch_size = eval_sets_of(run_dir)
    out = {}
    for split, eval_set in data.eval_sets.items():
        n = len(eval_set.answers)
        chunk = np.concatenate([eval_set.inputs, np.zeros((batch_size - n, eval_set.inputs.shape[1]), np.int32)])
        ids = np.asarray(evaluate.greedy_decode(model, params, jnp.asarray(chunk), data.target_length))[:n]
        out[split] = [row[: row.index(1)] if 1 in row else row for row in ids.tolist()]
    return out


def test_compare_pairs_rt_with_the_ce_run_and_decodes_numbers(vocab, trained, capsys):
    from ntl_jax import cli
    from ntl_jax.train import data as data_lib

    out, argv, dirs = trained
    assert cli.main(["compare"] + argv) == 0
    assert "rt+ntl-mse" in capsys.readouterr().out
    result = json.load(open(os.path.join(out, "compare.json")))
    assert result["reused_runs"] == 2  # the two trained above
    runs = {r["loss"]: r for r in result["runs"]}
    assert set(runs) == {"ce", "rt", "rt+ntl-mse"} and {r["seed"] for r in runs.values()} == {0}
    for loss in ("rt", "rt+ntl-mse"):
        assert runs[loss]["baseline"] == "ce"
        paired = result["paired"][loss]["test_interpolate/number_accuracy"]
        assert paired["baseline"] == "ce" and paired["n"] == 1
        assert paired["mean_diff"] == pytest.approx(runs[loss]["metrics"]["test_interpolate/number_accuracy"]
                                                    - runs["ce"]["metrics"]["test_interpolate/number_accuracy"])

    def eval_sets_of(run_dir):
        config = json.load(open(os.path.join(run_dir, "config.json")))
        return data_lib.ProblemData(data_lib.DataConfig(**config["data"]), vocabulary=vocab), 250

    base_digit_ids = {vocab.base.encode(str(d))[-1] for d in range(10)}
    for loss in ("rt", "rt+ntl-mse"):
        predictions = json.load(open(os.path.join(dirs[loss], "predictions.json")))
        generated = _greedy_ids(vocab, dirs[loss], eval_sets_of)
        assert set(predictions) == set(generated) == {"test_interpolate", "test_extrapolate"}
        with_numbers = 0
        for split, rows in predictions.items():
            assert [r["prediction"] for r in rows] == [vocab.decode(ids) for ids in generated[split]]
            for row, ids in zip(rows, generated[split]):
                assert not base_digit_ids & set(ids), (row, ids)  # numbers only ever as RT tokens
                others = [vocab.id_to_piece(i) for i in ids if i < BASE_SIZE]
                if any(re.search(r"[0-9.]", p) for p in others):
                    continue  # text between the numbers could join them
                # each RT run (places decreasing) is one number of the text, sum d * 10^p
                found = [Fraction(m.group(0)) for m in AUTHORS_NUMBER.finditer(row["prediction"])]
                assert found == rt_values(vocab, ids), (row, ids)
                with_numbers += bool(found)
        assert with_numbers >= 8  # of 16: after 200 steps the model answers with numbers
    assert runs["ce"]["run_dir"] != runs["rt"]["run_dir"]
