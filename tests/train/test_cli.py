"""`ntl-jax train / compare / plot-loss` end to end on the micro preset."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("matplotlib")

import jax  # noqa: E402

from ntl_jax import cli  # noqa: E402

MICRO = ["--preset", "micro", "--train-examples", "16", "--eval-examples", "4",
         "--batch-size", "8", "--log-every", "1", "--checkpoint-every", "2", "--no-progress"]


@pytest.fixture(scope="module")
def real_data():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mathematics_dataset")


def test_train_end_to_end_and_rerun_resumes(real_data, tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["train", "--loss", "ntl-mse", "--steps", "3", "--seed", "1", "--out", out] + MICRO
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "generating 16 training problems of arithmetic__add_or_sub (seed 1) ..." in printed
    assert "step 3, evaluation:" in printed and "resuming" not in printed
    results = json.load(open(os.path.join(out, "results.json")))
    assert results["step"] == 3
    assert 0.0 <= results["eval"]["test_interpolate/number_accuracy"] <= 1.0
    assert "test_extrapolate/mae" in results["eval"]
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    assert all(np.isfinite(r["train/ntl"]) for r in records if "train/ntl" in r)
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(out, "tensorboard")))
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["2", "3"]
    # The same command again finds the finished run and reports its results.
    assert cli.main(argv) == 0
    assert json.load(open(os.path.join(out, "results.json")))["eval"] == results["eval"]
    assert "step 3, evaluation:" in capsys.readouterr().out
    # Another loss into the same directory is refused, and the checkpoint survives.
    bad = list(argv)
    bad[bad.index("ntl-mse")] = "ce"
    assert cli.main(bad) == 2
    assert "different configuration" in capsys.readouterr().err
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["2", "3"]


def test_train_resumes_saying_from_where(real_data, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "run")
    argv = ["train", "--loss", "ce", "--steps", "4", "--out", out] + MICRO
    from ntl_jax.train import trainer

    real_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **k: real_train(*a, **k, stop_after=2))
    assert cli.main(argv) == 0
    monkeypatch.setattr(trainer, "train", real_train)
    capsys.readouterr()
    assert cli.main(argv) == 0
    checkpoint = os.path.join(out, "checkpoints", "2")
    assert f"resuming from step 2 (checkpoint {checkpoint})" in capsys.readouterr().out


def test_interrupted_train_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    from ntl_jax.train import trainer

    def interrupted(*args, **kwargs):
        raise trainer.Interrupted(7, "run/checkpoints/7")

    monkeypatch.setattr(trainer, "train", interrupted)
    assert cli.main(["train", "--out", str(tmp_path)] + MICRO) == 130
    err = capsys.readouterr().err
    assert err.strip() == ("ntl-jax train: interrupted at step 7; rerun the same command to "
                           "resume (checkpoint run/checkpoints/7)")


def test_metric_table_says_n_a_for_undefined_metrics():
    from ntl_jax.cli.train import format_metrics

    assert format_metrics({"b/pearson": None, "a/acc": 0.5, "c/r2": float("nan")}) == (
        "  a/acc      0.5\n  b/pearson  n/a\n  c/r2       n/a")


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "expected a positive integer, got 0"),
    (["--loss", "ntl-foo"], "argument --loss: expected a loss name (ce, gce, a number loss of ntl_jax.losses by "),
    (["--loss", "ntl-foo"], "or one of regression-head, rt, rt+ntl-mse, xval), got 'ntl-foo'"),
    (["--loss", "smmd(foo=1)"], "argument --loss: number loss 'smmd' has no parameter 'foo'"),
    (["--loss", "smmd(sigma=-1)"], "number loss 'smmd': expected sigma finite and > 0, got -1"),
    (["--ntl-weight", "del=x"], "expected LAMBDA or LOSS=LAMBDA, LAMBDA a finite number >= 0, got 'del=x'"),
    (["--ntl-weight", "smmd(mode=mmd)"], "LAMBDA a finite number >= 0, got 'smmd(mode=mmd)'"),
    (["--ntl-weight", "foo=1"], "expected LAMBDA or LOSS=LAMBDA, got 'foo=1': expected a loss name"),
    (["--del-weight", "0.01"], "--del-weight was removed in ntl-jax 0.3.0: each loss's weight is --ntl-weight "
                               "[LOSS=]LAMBDA; use --ntl-weight del=0.01"),
    (["--smmd-weight"], "--smmd-weight was removed in ntl-jax 0.3.0: each loss's weight is --ntl-weight "
                        "[LOSS=]LAMBDA; use --ntl-weight smmd=LAMBDA"),
    (["--learning-rate", "-1"], "expected a finite number > 0, got -1.0"),
    (["--learning-rate", "inf"], "expected a finite number > 0, got inf"),
    (["--learning-rate", "nan"], "expected a finite number > 0, got nan"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--ntl-weight", "inf"], "expected a finite number >= 0, got inf"),
    (["--dropout-rate", "1"], "expected a number in [0, 1), got 1.0"),
    (["--dropout-rate", "-0.1"], "expected a number in [0, 1), got -0.1"),
])
def test_train_rejects_bad_flags(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--out", str(tmp_path)] + flags)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_train_rejects_bad_module_and_unwritable_out(real_data, tmp_path, capsys):
    assert cli.main(["train", "--module", "arithmetic__nope", "--out", str(tmp_path)]) == 2
    assert "expected a mathematics module" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["train", "--out", str(blocker / "run")] + MICRO) == 2
    assert "not writable" in capsys.readouterr().err


def test_plot_loss_values_and_png(tmp_path):
    from ntl_jax import losses
    from ntl_jax.cli.plot_loss import legend_name, loss_curves, peaked

    c = 0.9
    curves = loss_curves(4, peaked(c))
    rest = (1 - c) / 9
    # Row 4 puts c on the target: CE = -log c; WAS = rest * sum_{j != 4} |4 - j| = rest * 25;
    # MSE = (E[v] - 4)^2 with E[v] = 4c + rest * (45 - 4).
    np.testing.assert_allclose(curves["CE"][4], -np.log(c), rtol=1e-5)
    np.testing.assert_allclose(curves["NTL-WAS"][4], rest * 25, rtol=1e-5)
    np.testing.assert_allclose(curves["NTL-MSE"][4], (4 * c + rest * 41 - 4) ** 2, rtol=1e-4)
    # CE is the same for every wrong digit; WAS grows with the distance to the target.
    np.testing.assert_allclose(curves["CE"][[0, 3, 5, 9]], -np.log(rest), rtol=1e-5)
    assert np.all(np.diff(curves["NTL-WAS"][4:]) > 0) and np.all(np.diff(curves["NTL-WAS"][:5]) < 0)
    # DEL on the logits log p: the ones' place weight 2 times sum_k p_k BCE(log p_k, [k = 4]),
    # BCE(z, 0) = softplus(z) = log(1 + p), BCE(z, 1) = softplus(z) - z; the same for every
    # wrong digit, as CE. DIST²: KL(q || p) with q_j ~ exp(-(j - 4)^2).
    bce = c * (np.log1p(c) - np.log(c)) + 9 * rest * np.log1p(rest)
    np.testing.assert_allclose(curves["DEL"][4], 2 * bce, rtol=1e-5)
    wrong = c * np.log1p(c) + rest * (np.log1p(rest) - np.log(rest)) + 8 * rest * np.log1p(rest)
    np.testing.assert_allclose(curves["DEL"][[0, 3, 5, 9]], 2 * wrong, rtol=1e-5)
    q = np.exp(-(np.arange(10) - 4.0) ** 2)
    q /= q.sum()
    np.testing.assert_allclose(curves["DIST2"][4], np.sum(q * np.log(q)) - q[4] * np.log(c)
                               - (1 - q[4]) * np.log(rest), rtol=1e-5)
    # Any spec: squashed, the table's closest wrong digit costs 1 and its farthest (9 away) 3.
    squashed = loss_curves(4, np.eye(10), ["was(squash_factor=3.0)"])
    np.testing.assert_allclose(squashed["NTL-WAS(squash_factor=3.0)"][[0, 3, 4, 5, 9]],
                               [1.75, 1.0, 0.0, 1.0, 2.0], rtol=1e-5, atol=1e-6)
    # By default every shipped loss, as the registry names them.
    assert list(loss_curves(4, peaked(c))) == ["CE"] + [legend_name(name) for name in losses.NAMES]
    out = tmp_path / "loss.png"
    assert cli.main(["plot-loss", "--digit", "7", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        cli.main(["plot-loss", "--digit", "12"])
    for bad in ("none", "gce"):
        with pytest.raises(SystemExit):
            cli.main(["plot-loss", "--losses", bad])


@pytest.mark.parametrize("checkpoint_every", [1, 2])
def test_a_diverging_run_stops_naming_the_steps_and_checkpoints_nothing_non_finite(
        real_data, tmp_path, capsys, monkeypatch, checkpoint_every):
    from ntl_jax.train import trainer
    from ntl_jax.train.checkpoint import Checkpointer

    saved = []
    real_save = Checkpointer.save

    def save(self, step, state, identity):
        saved.append(all(bool(np.isfinite(np.asarray(x)).all())
                         for x in jax.tree_util.tree_leaves(state.params)))
        real_save(self, step, state, identity)

    monkeypatch.setattr(Checkpointer, "save", save)
    flags = MICRO[:MICRO.index("--checkpoint-every")] + MICRO[MICRO.index("--checkpoint-every") + 2:]
    code = cli.main(["train", "--out", str(tmp_path / "run"), "--steps", "6",
                     "--learning-rate", "1e12", "--warmup-steps", "0",
                     "--checkpoint-every", str(checkpoint_every)] + flags)
    assert code == 1
    err = capsys.readouterr().err
    assert "training diverged: the mean loss of steps" in err and "lower --learning-rate" in err
    assert all(saved)
    assert not (tmp_path / "run" / trainer.FINAL_PARAMS).exists()
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_state_that_is_not_finite_after_the_last_update_is_not_saved(tmp_path):
    # The loss of step k is computed before its update: the state itself is checked too.
    from ntl_jax.train import trainer

    class Recorder:
        saved = []

        def latest_step(self):
            return 4

        def save(self, step, state, identity):
            self.saved.append(step)

    state = {"params": jax.numpy.array([1.0, np.nan]), "count": jax.numpy.array(3)}
    with pytest.raises(trainer.Diverged, match=r"the training state after step 5 is not "
                       r"finite; the last checkpoint \(step 4\) is from before"):
        trainer._save_finite(Recorder(), 5, state, {}, str(tmp_path))
    trainer._save_finite(Recorder(), 6, {"params": jax.numpy.ones(2)}, {}, str(tmp_path))
    assert Recorder.saved == [6]


def test_training_stops_survive_the_trip_from_a_worker_process():
    import pickle

    from ntl_jax.train import trainer

    for e in (trainer.Diverged("runs/x", "the mean loss of steps 1..2 is nan", None),
              trainer.Interrupted(7, "runs/x/checkpoints/7")):
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and str(again) == str(e)
