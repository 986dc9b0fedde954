"""The train step and loop: overfitting, no recompilation, checkpoint/resume, errors."""

import json
import os
import signal

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from conftest import addition_source, fake_data, micro_config  # noqa: E402

from ntl_jax.train import data as data_lib  # noqa: E402
from ntl_jax.train import network, optim, trainer  # noqa: E402
from ntl_jax.train import step as step_lib
from ntl_jax.train.checkpoint import CheckpointError  # noqa: E402


def test_batches_are_deterministic_and_cover_each_epoch(vocabulary):
    data = fake_data(vocabulary, n=24, batch=8)
    again = fake_data(vocabulary, n=24, batch=8)
    for step in (0, 2, 3, 7):
        for k, v in data.batch(step).items():
            np.testing.assert_array_equal(v, again.batch(step)[k])
    epoch = np.concatenate([data.batch(s)["encoder_input_tokens"] for s in range(3)])
    assert len({row.tobytes() for row in epoch}) == len({r.tobytes() for r in data._inputs})
    b = data.batch(0)
    # decoder inputs are the targets shifted right with 0 (BOS); weights mark real tokens
    np.testing.assert_array_equal(b["decoder_input_tokens"][:, 1:], b["decoder_target_tokens"][:, :-1])
    assert (b["decoder_input_tokens"][:, 0] == 0).all()
    np.testing.assert_array_equal(b["decoder_loss_weights"], b["decoder_target_tokens"] > 0)
    assert (b["decoder_target_tokens"] == data_lib.EOS_ID).sum() == 8  # one EOS per row


def _step_setup(vocabulary, loss="ntl-was", lr=1e-2):
    data = fake_data(vocabulary, n=8, batch=8)
    cfg = network.make_config("micro", vocabulary.vocab_size)
    model = network.Transformer(cfg)
    nt = trainer.number_tokens_of(vocabulary)
    opt = optim.make_optimizer("adamw", learning_rate=lr, total_steps=1000, warmup_steps=0,
                               weight_decay=0.0)
    batch = data.batch(0)
    state = step_lib.create_train_state(model, opt, batch, seed=0)
    return step_lib.make_train_step(model, opt, nt, loss=loss), state, batch, data


def test_overfits_one_batch(vocabulary):
    train_step, state, batch, _ = _step_setup(vocabulary)
    first = None
    for i in range(150):
        state, m = train_step(state, batch)
        first = float(m["cross_entropy"]) if first is None else first
    # ~log(45) = 3.8 per token at the start; memorising 8 short answers gets far lower.
    assert first > 3.0
    assert float(m["cross_entropy"]) < 0.3
    assert float(m["ntl"]) < 0.3


def test_train_step_compiles_once(vocabulary):
    train_step, state, _, data = _step_setup(vocabulary)
    data = fake_data(vocabulary, n=32, batch=8)
    for s in range(4):
        state, _ = train_step(state, data.batch(s))
    assert train_step._cache_size() == 1
    assert int(state.step) == 4


def test_equal_runs_share_one_built_step_and_only_the_latest_is_kept(vocabulary):
    data = fake_data(vocabulary, n=8, batch=8)
    model_config = network.make_config("micro", vocabulary.vocab_size)

    def built(vocab, **overrides):
        spec = trainer.StepSpec.of(micro_config(data, **overrides), model_config,
                                   trainer.number_tokens_of(vocab))
        return trainer.build_step(spec)

    first = built(vocabulary)
    assert built(type(vocabulary)()) is first  # another vocabulary object, the same pieces

    class OtherPieces(type(vocabulary)):
        chars = type(vocabulary).chars[::-1]  # the same size, the digits at other ids

    other = built(OtherPieces())
    assert other is not first
    assert built(OtherPieces(), ntl_weight=0.1) is not other
    assert trainer.build_step.cache_info().currsize == 1


def test_ce_and_ntl_losses_differ_only_in_ntl_term(vocabulary):
    ce_step, state, batch, _ = _step_setup(vocabulary, loss="ce")
    was_step, _, _, _ = _step_setup(vocabulary, loss="ntl-was")
    _, m_ce = ce_step(state, batch)
    _, m_was = was_step(state, batch)
    np.testing.assert_allclose(m_ce["cross_entropy"], m_was["cross_entropy"], rtol=1e-6)
    np.testing.assert_allclose(m_was["loss"] - m_ce["loss"], m_was["ntl_term"], rtol=1e-5)
    # ntl: the mean NTL-WAS over the number targets; ntl_term (since 0.5.0): 0.3 times that mean
    # times the CE's weight sum over the factor, which under NUM_REAL_TARGET_TOKENS is 0.3 * the mean.
    weight_sum = float(np.sum(np.asarray(batch["decoder_loss_weights"], np.float64)))
    assert weight_sum > float(m_was["ntl_weight_sum"]) > 0  # not every target is a number
    np.testing.assert_allclose(m_was["weight_sum"], weight_sum, rtol=1e-6)
    np.testing.assert_allclose(m_was["ntl_term"], 0.3 * m_was["ntl"] * weight_sum
                               / m_was["loss_normalizing_factor"], rtol=1e-6)
    np.testing.assert_allclose(m_was["ntl_term"], 0.3 * m_was["ntl"], rtol=1e-6)
    assert float(m_was["ntl"]) > 0 and float(m_ce["ntl_term"]) == 0
    np.testing.assert_allclose(m_ce["ntl"], m_was["ntl"], rtol=1e-6)  # CE logs the same NTL-WAS


def _train_records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if "examples_per_second" not in k} for r in recs]


def test_resume_equals_uninterrupted_run(vocabulary, tmp_path):
    data = fake_data(vocabulary)
    cfg = micro_config(data)
    full = trainer.train(cfg, str(tmp_path / "full"), data=data, progress=False,
                         tensorboard=False)
    # Interrupted after step 6: the last checkpoint is step 4, logs reach step 6.
    part = str(tmp_path / "part")
    first = trainer.train(cfg, part, data=data, progress=False, tensorboard=False, stop_after=6)
    assert first["step"] == 6 and "eval" not in first
    os.rename(os.path.join(part, "checkpoints", "6"), os.path.join(part, "moved_6"))
    resumed = trainer.train(cfg, part, data=fake_data(vocabulary), progress=False, tensorboard=False)
    assert resumed["step"] == 12
    for a, b in zip(jax.tree_util.tree_leaves(full["state"]),
                    jax.tree_util.tree_leaves(resumed["state"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _train_records(part) == _train_records(str(tmp_path / "full"))
    assert resumed["eval"] == full["eval"]
    assert set(full["eval"]) >= {"test_interpolate/number_accuracy", "test_extrapolate/mae"}


def test_incompatible_and_corrupt_checkpoints_raise_and_keep_files(vocabulary, tmp_path):
    data = fake_data(vocabulary)
    out = str(tmp_path / "run")
    trainer.train(micro_config(data, steps=4), out, data=data, progress=False, tensorboard=False)
    ckpt = os.path.join(out, "checkpoints", "4")
    message = "different configuration.*loss: checkpoint has 'ntl-was', this run has 'ce'"
    with pytest.raises(CheckpointError, match=message):
        trainer.train(micro_config(data, steps=4, loss="ce"), out, data=data, progress=False,
                      tensorboard=False)
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(ckpt) for f in fs)
    for path in files:  # damage every file of the checkpoint
        with open(path, "wb") as f:
            f.write(b"\x00garbage")
    with pytest.raises(CheckpointError, match="cannot be read|damaged"):
        trainer.train(micro_config(data, steps=4), out, data=data, progress=False, tensorboard=False)
    assert sorted(os.path.join(r, f) for r, _, fs in os.walk(ckpt) for f in fs) == files


def test_bad_config_and_unwritable_output(vocabulary, tmp_path):
    data = fake_data(vocabulary)
    with pytest.raises(ValueError, match=r"loss: expected a loss name \(ce, gce, a number loss of .* got 'xent'"):
        trainer.train(micro_config(data, loss="xent"), str(tmp_path / "a"), data=data)
    with pytest.raises(ValueError, match="multiple of log_every"):
        trainer.train(micro_config(data, checkpoint_every=5), str(tmp_path / "a"), data=data)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not writable"):
        trainer.train(micro_config(data), str(blocker / "sub"), data=data)


class _InterruptAt(data_lib.ProblemData):
    """Sends this process SIGINT while serving batch `at`, as Ctrl-C would."""

    at = -1

    def batch(self, step):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().batch(step)


def test_sigint_saves_a_checkpoint_and_the_rerun_finishes_identically(vocabulary, tmp_path):
    data = fake_data(vocabulary)
    cfg = micro_config(data)
    full = trainer.train(cfg, str(tmp_path / "full"), data=data, progress=False,
                         tensorboard=False)
    stopped = _InterruptAt(data.config, vocabulary=vocabulary, example_source=addition_source)
    stopped.at = 6  # Ctrl-C during step 7: step 7 finishes, then the run stops at step 7
    out = str(tmp_path / "run")
    before = signal.getsignal(signal.SIGINT)  # the default, or SIG_IGN in a background job
    with pytest.raises(trainer.Interrupted, match="interrupted at step 7; rerun the same "
                                                  "command to resume") as e:
        trainer.train(cfg, out, data=stopped, progress=False, tensorboard=False)
    assert e.value.step == 7
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["4", "7"]
    assert signal.getsignal(signal.SIGINT) is before  # restored
    resumed = trainer.train(cfg, out, data=data, progress=False, tensorboard=False)
    for a, b in zip(jax.tree_util.tree_leaves(full["state"]),
                    jax.tree_util.tree_leaves(resumed["state"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed["eval"] == full["eval"]


def test_finished_run_reports_its_results_and_changes_nothing(vocabulary, tmp_path, capsys):
    data = fake_data(vocabulary)
    out = str(tmp_path / "run")
    first = trainer.train(micro_config(data, steps=4), out, data=data, progress=False,
                          tensorboard=False)
    before = {name: open(os.path.join(out, name)).read()
              for name in ("metrics.jsonl", "results.json")}
    again = trainer.train(micro_config(data, steps=4), out, data=data, tensorboard=False)
    assert again["eval"] == first["eval"] and again["train"] == first["train"]
    assert {name: open(os.path.join(out, name)).read() for name in before} == before


def test_results_are_strict_json_with_null_for_undefined_metrics(vocabulary, tmp_path,
                                                                 monkeypatch):
    path = str(tmp_path / "x.json")
    trainer.write_json(path, {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}})

    def reject(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    assert json.loads(open(path).read(), parse_constant=reject) == {
        "a": None, "b": [1.0, None], "c": {"d": 2}}
    # The correlation of constant predictions is undefined (NaN): null in every file.
    from ntl_jax.train import evaluate

    monkeypatch.setattr(evaluate, "score", lambda preds, targets: {
        "pearson": float("nan"), "number_accuracy": 0.25})
    data = fake_data(vocabulary)
    out = str(tmp_path / "run")
    result = trainer.train(micro_config(data, steps=2), out, data=data, progress=False,
                           tensorboard=False)
    assert result["eval"] == {"test_interpolate/pearson": None,
                              "test_interpolate/number_accuracy": 0.25,
                              "test_extrapolate/pearson": None,
                              "test_extrapolate/number_accuracy": 0.25}
    for name in ("results.json", "metrics.jsonl"):
        for line in (open(os.path.join(out, name)).read().splitlines() if name.endswith("l")
                     else [open(os.path.join(out, name)).read()]):
            json.loads(line, parse_constant=reject)
    assert json.load(open(os.path.join(out, "results.json")))["eval"] == result["eval"]


def _finished(vocabulary, tmp_path, name="pre", **kw):
    data = fake_data(vocabulary)
    out = str(tmp_path / name)
    result = trainer.train(micro_config(data, steps=4, loss="ce", **kw), out, data=data,
                           progress=False, tensorboard=False)
    return data, out, result


def test_init_from_starts_from_the_final_parameters_with_a_fresh_optimizer(vocabulary,
                                                                            tmp_path):
    data, pre, pretrained = _finished(vocabulary, tmp_path)
    cfg = micro_config(data, steps=1, init_from=pre, learning_rate=1e-9, warmup_steps=0)
    tuned = trainer.train(cfg, str(tmp_path / "tuned"), data=data, progress=False,
                          tensorboard=False)
    # One step at a learning rate of 1e-9 leaves the pretrained parameters (almost) as
    # they were, and the optimizer state is new: its step counter restarted.
    for a, b in zip(jax.tree_util.tree_leaves(pretrained["state"].params),
                    jax.tree_util.tree_leaves(tuned["state"].params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert int(tuned["state"].step) == 1
    counts = [int(x) for x in jax.tree_util.tree_leaves(tuned["state"].opt_state)
              if getattr(x, "dtype", None) == np.int32 and x.ndim == 0]
    assert counts and max(counts) == 1
    # From a random initialisation the same step lands where the pretraining started: four
    # Adam steps (warm-up to 3e-3) moved the parameters by a few 1e-3, far beyond the 1e-6
    # that the step from the pretrained parameters moved them.
    fresh = trainer.train(micro_config(data, steps=1, learning_rate=1e-9, warmup_steps=0),
                          str(tmp_path / "fresh"), data=data, progress=False,
                          tensorboard=False)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
        jax.tree_util.tree_leaves(pretrained["state"].params),
        jax.tree_util.tree_leaves(fresh["state"].params)))
    assert diff > 1e-3


def test_init_from_rejects_unfinished_mismatched_and_damaged_runs(vocabulary, tmp_path):
    data, pre, _ = _finished(vocabulary, tmp_path)
    with pytest.raises(ValueError, match="expected a finished run directory"):
        trainer.train(micro_config(data, init_from=str(tmp_path / "missing")),
                      str(tmp_path / "a"), data=data, progress=False, tensorboard=False)
    with pytest.raises(ValueError, match="emb_dim: .* has '16', this run has '64'"):
        trainer.train(micro_config(data, preset="tiny", init_from=pre), str(tmp_path / "b"),
                      data=data, progress=False, tensorboard=False)

    class OtherPieces(type(vocabulary)):
        chars = type(vocabulary).chars[::-1]

    other = data_lib.ProblemData(data.config, vocabulary=OtherPieces(),
                                 example_source=addition_source)
    with pytest.raises(ValueError, match="vocabulary: the pieces differ"):
        trainer.train(micro_config(data, init_from=pre), str(tmp_path / "c"), data=other,
                      progress=False, tensorboard=False)
    with open(os.path.join(pre, trainer.FINAL_PARAMS), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))  # one flipped bit
    with pytest.raises(ValueError, match="does not match the checksum"):
        trainer.train(micro_config(data, init_from=pre), str(tmp_path / "d"), data=data,
                      progress=False, tensorboard=False)


def test_the_progress_bar_clock_starts_after_the_compiling_first_step(vocabulary, tmp_path,
                                                                       monkeypatch):
    # The first call of the step compiles it: counted in the bar's clock, it made the
    # rate and time left of a long run promise hours at step 1.
    import time

    import tqdm

    bars, first_step_done = [], []

    class RecordedBar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    built = trainer.build_step

    def build_step(spec):
        model, optimizer, train_step = built(spec)

        def timed_step(state, batch):
            out = train_step(state, batch)
            if not first_step_done:
                first_step_done.append(time.time())  # tqdm's clock
            return out

        return model, optimizer, timed_step

    monkeypatch.setattr(tqdm, "tqdm", RecordedBar)
    monkeypatch.setattr(trainer, "build_step", build_step)
    data = fake_data(vocabulary, n=16, batch=8)
    trainer.train(micro_config(data, steps=3, log_every=1, checkpoint_every=3), str(tmp_path / "run"),
                  data=data, progress=True, tensorboard=False)
    (bar,) = bars
    assert bar.n == 3
    assert bar.start_t >= first_step_done[0]


def test_the_progress_bar_figures_add_up():
    """The bar's loss is ce + z_loss (+ ntl_term where the run trains on a number loss);
    ntl, logged in CE runs too, stands apart."""
    ce_run = {"loss": 5.0012, "cross_entropy": 4.9961, "z_loss": 0.0051, "ntl_term": 0.0, "ntl": 2.31,
              "grad_norm": 1.5}
    assert trainer._bar_fields(ce_run) == {"loss": "5.001", "ce": "4.996", "z_loss": "0.005", "ntl": "2.310"}
    ntl_run = ce_run | {"loss": 5.6942, "ntl_term": 0.693}
    assert trainer._bar_fields(ntl_run) == {"loss": "5.694", "ce": "4.996", "z_loss": "0.005",
                                            "ntl_term": "0.693", "ntl": "2.310"}
    assert trainer._bar_fields({"loss": 0.25, "grad_norm": 1.0}) == {"loss": "0.250"}  # the regression head
