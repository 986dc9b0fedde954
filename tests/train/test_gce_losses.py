"""The trainer's Gaussian-smoothed losses: `--loss gce` and `gce+ntl-<variant>` (the
paper's GCE + NTL-WAS-CDF is `gce+ntl-was-cdf`), `--gce-sigma`, on the micro preset."""

import json
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from conftest import fake_data, first_step, micro_config  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import cli, losses  # noqa: E402
from ntl_jax.cli import compare as cli_compare  # noqa: E402
from ntl_jax.cli import train as cli_train  # noqa: E402
from ntl_jax.train import loss_names, systems, trainer  # noqa: E402
from ntl_jax.train import step as step_lib  # noqa: E402
from ntl_jax.train.checkpoint import CheckpointError  # noqa: E402
from tests.test_gce_and_cdf import reference  # noqa: E402


def test_every_loss_name_is_a_step_loss():
    # Each name is the one runs record, and names a number loss of ntl_jax.losses.
    assert [systems.canonical(loss) for loss in cli_train.LOSSES] == list(cli_train.LOSSES)
    assert {loss_names.number_loss(loss).name for loss in cli_train.LOSSES} == set(losses.NAMES)
    assert {"gce", "ntl-was-cdf", "gce+ntl-was-cdf", "gce+ntl-was"} <= set(cli_train.LOSSES)
    assert loss_names.number_loss("gce+ntl-was-cdf") is losses.was_cdf()
    # Its label is GCE's: NTL-WAS-CDF against a Gaussian label of GCE's width.
    assert step_lib.objective("gce+ntl-was-cdf", 0.3, 2.0) == dict(
        number_loss=losses.was_cdf(sigma=2.0), ntl_weight=0.3, cross_entropy=ntl_jax.CrossEntropy(gce_sigma=2.0))
    assert step_lib.objective("ntl-was-cdf", 0.3, 2.0) == dict(number_loss=losses.was_cdf(), ntl_weight=0.3,
                                                               cross_entropy=ntl_jax.CrossEntropy())
    assert [loss for loss in cli_train.LOSSES if not step_lib.trains_ntl(loss)] == ["ce", "gce"]


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
@pytest.mark.parametrize("loss,sigma", [("gce", 1.0), ("gce+ntl-was-cdf", 2.0), ("ntl-was-cdf", None)])
def test_the_step_trains_on_the_reference_objective(vocabulary, fused_loss, loss, sigma):
    options = {} if sigma is None else {"gce_sigma": sigma}
    metrics, logits, batch, nt = first_step(vocabulary, loss, fused_loss, **options)
    weights = np.asarray(batch["decoder_loss_weights"], np.float64)
    kind = "was" if loss == "gce" else "was_cdf"
    targets = np.asarray(batch["decoder_target_tokens"])
    # ntl_mean: the reference's weighted mean over the number targets; ntl: that mean normalised as
    # CE is (since 0.5.0, mean * weight_sum / factor), here the mean itself, the factor the weights' sum.
    _, ce, ntl, _, ntl_mean = reference(logits, targets, weights, nt, sigma=sigma or 0.0, kind=kind,
                                        factor=weights.sum())
    counted = np.sum(weights * np.isin(targets, np.asarray(nt.ids)))  # the number targets' weights
    assert 0 < counted < weights.sum()  # so the old term, lambda * ntl_sum / factor, differs
    np.testing.assert_allclose(ntl, ntl_mean, rtol=1e-12)
    # float32 sums over 8 rows of O(1) terms (the fused head sums in another order).
    np.testing.assert_allclose(float(metrics["cross_entropy"]), ce, rtol=2e-5)
    # The logged ntl is the number loss's mean over the number targets; ntl_term what the loss adds:
    # since 0.5.0, lambda * that mean * weight_sum / factor, the factor here the weights' sum
    # (NUM_REAL_TARGET_TOKENS), so lambda * the mean (no longer lambda * its sum over the factor).
    np.testing.assert_allclose(float(metrics["ntl"]), ntl_mean, rtol=2e-5)
    weight = 0.0 if loss == "gce" else 0.3  # gce only logs NTL-WAS, as ce does
    np.testing.assert_allclose(float(metrics["ntl_term"]), weight * ntl_mean, rtol=2e-5, atol=0)
    np.testing.assert_allclose(float(metrics["loss"]), float(metrics["cross_entropy"] + metrics["z_loss"])
                               + float(metrics["ntl_term"]), rtol=1e-6)


def test_gce_sigma_is_part_of_the_identity_of_gce_runs_only(vocabulary, tmp_path):
    data = fake_data(vocabulary)
    assert "gce_sigma" not in micro_config(data, loss="ntl-was-cdf").identity()
    assert micro_config(data, loss="gce").identity()["gce_sigma"] == 1.0
    with pytest.raises(ValueError, match="expected a finite gce_sigma > 0 for loss 'gce', got 0.0"):
        micro_config(data, loss="gce", gce_sigma=0.0).validate()
    out = str(tmp_path / "run")
    result = trainer.train(micro_config(data, loss="gce+ntl-was-cdf", gce_sigma=0.5, steps=4), out, data=data,
                           progress=False, tensorboard=False)
    assert result["step"] == 4
    assert json.load(open(os.path.join(out, "config.json")))["gce_sigma"] == 0.5
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert all(np.isfinite(r["train/ntl"]) and r["train/ntl"] > 0 for r in records if "train/ntl" in r)
    with pytest.raises(CheckpointError, match="gce_sigma: checkpoint has 0.5, this run has 1.0"):
        trainer.train(micro_config(data, loss="gce+ntl-was-cdf", steps=4), out, data=data, progress=False,
                      tensorboard=False)


MICRO = ["--preset", "micro", "--train-examples", "16", "--eval-examples", "4", "--batch-size", "8",
         "--log-every", "1", "--checkpoint-every", "2", "--no-progress", "--no-tensorboard"]


def test_flags_reach_the_config_and_an_unused_sigma_is_refused(tmp_path, capsys):
    argv = ["train", "--loss", "gce+ntl-was-cdf", "--gce-sigma", "2.5", "--out", str(tmp_path)] + MICRO
    args = cli.build_parser(argv).parse_args(argv)
    config = cli_train.make_config(args, args.loss, 0)
    assert (config.loss, config.gce_sigma) == ("gce+ntl-was-cdf", 2.5)
    argv = ["train", "--loss", "gce", "--out", str(tmp_path)] + MICRO
    assert cli_train.make_config(cli.build_parser(argv).parse_args(argv), "gce", 0).gce_sigma == 1.0
    assert cli.main(["train", "--loss", "ntl-was-cdf", "--gce-sigma", "1", "--out", str(tmp_path)] + MICRO) == 2
    assert ("--gce-sigma applies to the gce losses (gce, gce+ntl-<variant>), got ntl-was-cdf"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        cli.main(["train", "--loss", "gce", "--gce-sigma", "0", "--out", str(tmp_path)] + MICRO)
    assert "expected a finite number > 0, got 0.0" in capsys.readouterr().err
    assert cli.main(["compare", "--losses", "ntl-was", "--gce-sigma", "1", "--out", str(tmp_path)] + MICRO) == 2
    assert "got ntl-was" in capsys.readouterr().err


def test_compare_plans_gce_without_lambda_and_gce_ntl_with_each(tmp_path):
    argv = ["compare", "--losses", "gce", "gce+ntl-was-cdf", "--ntl-weight", "0.1", "0.3", "--seeds", "1",
            "--gce-sigma", "0.5", "--out", str(tmp_path)] + MICRO
    args = cli.build_parser(argv).parse_args(argv)
    _, runs = cli_compare.plan(args, str(tmp_path))
    assert [(r.label, r.ntl_weight, r.baseline) for r in runs] == [
        ("ce", 0.0, None), ("gce", 0.0, "ce"), ("gce+ntl-was-cdf λ=0.1", 0.1, "ce"),
        ("gce+ntl-was-cdf λ=0.3", 0.3, "ce")]
    configs = [cli_compare._config(args, r) for r in runs]
    assert [c.identity().get("gce_sigma") for c in configs] == [None, 0.5, 0.5, 0.5]
    assert os.path.basename(os.path.dirname(cli_compare.run_dir(str(tmp_path), runs[2]))) == \
        "gce_ntl-was-cdf_lambda=0.1"
