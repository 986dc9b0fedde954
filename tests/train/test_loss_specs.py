"""A number loss on the trainer's command line is one argument, a spec of
`ntl_jax.losses.parse` ("smmd(mode=mmd)"); its weight is `--ntl-weight [LOSS=]LAMBDA`,
by default the loss's own; the flags 0.3.0 removed are refused with the new form named;
and the kept comparisons under evidence/ resume from their commands in that form."""

import json
import os
import pathlib
import shlex

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

from conftest import first_step  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import cli, losses  # noqa: E402
from ntl_jax.cli import compare as cli_compare  # noqa: E402
from ntl_jax.cli import train as cli_train  # noqa: E402
from ntl_jax.train import step as step_lib  # noqa: E402
from ntl_jax.train import systems, trainer  # noqa: E402
from tests.objective_options import SQUARED_DISTANCE  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MICRO = ["--preset", "micro", "--train-examples", "16", "--eval-examples", "4", "--batch-size", "8",
         "--log-every", "1", "--checkpoint-every", "2", "--no-progress", "--no-tensorboard"]


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
def test_a_spec_reaches_the_step_with_its_parameters(vocabulary, fused_loss):
    metrics, logits, batch, nt = first_step(vocabulary, "smmd(mode=mmd)", fused_loss, ntl_weight=1.0)
    options = dict(weights=batch["decoder_loss_weights"], ntl_weight=1.0, z_loss=1e-4,
                   loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")
    targets = batch["decoder_target_tokens"]
    loss, parts = ntl_jax.cross_entropy_and_ntl(logits, targets, nt, number_loss=losses.smmd(mode="mmd"), **options)
    # float32 sums over 8 rows (the fused head sums in another order)
    np.testing.assert_allclose(metrics["ntl"], parts["ntl"], rtol=2e-5)
    np.testing.assert_allclose(metrics["ntl_term"], parts["ntl_term"], rtol=2e-5)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-5)
    # The parameter is the spec's: the default SMMD is another number.
    _, default = ntl_jax.cross_entropy_and_ntl(logits, targets, nt, number_loss=losses.smmd(), **options)
    assert abs(float(default["ntl"]) - float(metrics["ntl"])) > 1e-3 * float(default["ntl"])


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused"])
def test_a_loss_a_user_writes_trains_as_a_shipped_one(vocabulary, fused_loss):
    metrics, logits, batch, nt = first_step(vocabulary, SQUARED_DISTANCE, fused_loss, ntl_weight=0.3)
    # sum_j softmax(z)_j (v_j - y)^2 over the number tokens' logits z, in float64
    z = np.asarray(logits, np.float64)[..., np.asarray(nt.ids)]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    v = np.asarray(nt.number_values, np.float64)
    targets = np.asarray(batch["decoder_target_tokens"])
    weights = np.asarray(batch["decoder_loss_weights"], np.float64)
    is_number = np.isin(targets, np.asarray(nt.ids))
    y = np.where(is_number, np.asarray(nt.values, np.float64)[targets], 0.0)  # NaN off the number tokens
    per_position = np.where(is_number, np.sum(p * (v - y[..., None]) ** 2, axis=-1), 0.0)
    counted = np.where(is_number, weights, 0.0)
    total = np.sum(per_position * counted)
    np.testing.assert_allclose(metrics["ntl"], total / counted.sum(), rtol=2e-5)
    np.testing.assert_allclose(metrics["ntl_term"], 0.3 * total / counted.sum(), rtol=2e-5)  # the paper's


@pytest.fixture
def real_data():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("mathematics_dataset")


def test_the_cli_spec_trains_two_steps_and_the_same_loss_resumes_under_any_spelling(
        real_data, tmp_path, capsys, monkeypatch):
    seen = []
    real = step_lib.fused_cross_entropy_and_ntl

    def recording(*args, **kwargs):
        seen.append(kwargs["number_loss"])
        return real(*args, **kwargs)

    monkeypatch.setattr(step_lib, "fused_cross_entropy_and_ntl", recording)
    trainer.build_step.cache_clear()  # a step built before would not call it
    out = str(tmp_path / "run")
    assert cli.main(["train", "--loss", "smmd(mode=mmd)", "--steps", "2", "--out", out] + MICRO) == 0
    assert seen and all(value is losses.smmd(mode="mmd") for value in seen)
    config = json.load(open(os.path.join(out, "config.json")))
    assert (config["loss"], config["ntl_weight"]) == ("smmd(mode=mmd)", 1.0)  # SMMD's own weight
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in records if "train/ntl" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert np.isfinite(r["train/ntl"]) and r["train/ntl"] > 0
        assert r["train/ntl_term"] == pytest.approx(1.0 * r["train/ntl"], rel=1e-6)  # its mean, beside CE's
    capsys.readouterr()
    # The same loss spelt otherwise is the same run: it reports its results, trains nothing.
    calls = len(seen)
    argv = ["train", "--loss", "smmd(sigma=2, mode=mmd)", "--ntl-weight", "1", "--steps", "2", "--out", out]
    assert cli.main(argv + MICRO) == 0
    printed = capsys.readouterr().out
    assert "step 2, evaluation:" in printed and "resuming" not in printed and len(seen) == calls
    # Another parameter is another run.
    assert cli.main(["train", "--loss", "smmd(mode=smooth)", "--steps", "2", "--out", out] + MICRO) == 2
    assert "loss: checkpoint has 'smmd(mode=mmd)', this run has 'smmd(mode=smooth)'" in capsys.readouterr().err


def test_names_are_recorded_as_one_spelling():
    assert cli_train.system("smmd(mode=smmd, sigma=2.0)") == "smmd"
    assert cli_train.system("was_cdf") == "ntl-was-cdf"
    assert cli_train.system("gce+ntl-was-cdf( sigma = 0.5 )") == "gce+ntl-was-cdf(sigma=0.5)"
    assert cli_train.system("ntl-number-level(max_number_length=4)") == "ntl-number-level(max_number_length=4)"
    assert cli_train.system("rt+ntl-mse") == "rt+ntl-mse"
    config = trainer.TrainConfig(loss="dist2(tau=1)")
    assert config.loss == "dist2" and config.identity()["loss"] == "dist2"
    # The paper's GCE + NTL-WAS-CDF: the number loss scores against GCE's label, unless its spec sets one.
    assert step_lib.objective("gce+ntl-was-cdf(sigma=2.0)", 0.3, 0.5)["number_loss"] is losses.was_cdf(sigma=2.0)
    assert step_lib.objective("gce+ntl-was-cdf(reweigh=true)", 0.3, 0.5)["number_loss"] is losses.was_cdf(
        sigma=0.5, reweigh=True)
    with pytest.raises(ValueError, match="expected a loss name .* got 'ntl-del'"):
        trainer.TrainConfig(loss="ntl-del").validate()


def _plan(argv, out):
    args = cli.build_parser(["compare"] + argv).parse_args(["compare"] + argv + ["--out", str(out)])
    return args, cli_compare.plan(args, str(out))[1]


def test_compare_weights_plain_named_and_refused(tmp_path, capsys):
    _, runs = _plan(["--losses", "ntl-was", "ntl-mse", "smmd(mode=mmd)", "smmd(mode=smooth)", "--seeds", "1",
                     "--ntl-weight", "ntl-was=0.1", "smmd(mode=mmd)=0.5"], tmp_path)
    assert [(r.label, r.loss, r.ntl_weight) for r in runs] == [
        ("ce", "ce", 0.0), ("ntl-was", "ntl-was", 0.1), ("ntl-mse", "ntl-mse", 0.3),
        ("smmd(mode=mmd)", "smmd(mode=mmd)", 0.5), ("smmd(mode=smooth)", "smmd(mode=smooth)", 1.0)]
    assert {cli_compare.run_dir(str(tmp_path), r) for r in runs[3:]} == {
        str(tmp_path / "smmd_mode=mmd_" / "seed_0"), str(tmp_path / "smmd_mode=smooth_" / "seed_0")}
    # A plain weight sets every loss not named; several (or the flag again) sweep.
    _, runs = _plan(["--losses", "ntl-was", "ntl-mse", "--seeds", "1", "--ntl-weight", "0.1", "ntl-mse=1",
                     "--ntl-weight", "ntl-mse=3"], tmp_path)
    assert [(r.label, r.ntl_weight) for r in runs] == [("ce", 0.0), ("ntl-was", 0.1), ("ntl-mse λ=1", 1.0),
                                                       ("ntl-mse λ=3", 3.0)]
    # LOSS= names one loss as it is recorded: "smmd" is not "smmd(mode=mmd)", which keeps SMMD's default.
    _, runs = _plan(["--losses", "smmd", "smmd(mode=mmd)", "--seeds", "1", "--ntl-weight", "smmd=0.5"], tmp_path)
    assert [(r.label, r.ntl_weight) for r in runs] == [("ce", 0.0), ("smmd", 0.5), ("smmd(mode=mmd)", 1.0)]
    # One weight for losses whose defaults differ would change what the old flags meant: refused.
    with pytest.raises(ValueError, match=r"--ntl-weight 0.1 would weigh losses of different default weights "
                                         r"\(ntl-was 0.3, del 0.001\) alike; expected each named: "
                                         r"--ntl-weight ntl-was=LAMBDA del=LAMBDA"):
        _plan(["--losses", "ntl-was", "del", "--ntl-weight", "0.1"], tmp_path)
    with pytest.raises(ValueError, match=r"expected LOSS one of the compared losses with a weight \(ntl-was\), "
                                         r"got del=0.1 gce=1.0"):
        _plan(["--losses", "ntl-was", "gce", "--ntl-weight", "del=0.1", "gce=1"], tmp_path)
    assert cli.main(["compare", "--losses", "ntl-was", "del", "--ntl-weight", "0.1", "--out",
                     str(tmp_path / "x")] + MICRO) == 2
    assert "ntl-jax compare: error: --ntl-weight 0.1 would weigh" in capsys.readouterr().err
    assert not (tmp_path / "x" / "ce").exists()
    # train: the weight of the loss trained, or of its plain twin for a gce+ loss.
    train = cli.build_parser(["train"]).parse_args(["train", "--loss", "gce+del", "--ntl-weight", "del=0.01",
                                                    "--out", "x"])
    assert cli_train.make_config(train, train.loss, 0).ntl_weight == 0.01
    assert cli.main(["train", "--loss", "ntl-was", "--ntl-weight", "del=0.01", "--out", str(tmp_path / "y")]) == 2
    assert ("--ntl-weight expected LAMBDA or ntl-was=LAMBDA (the loss trained), got del=0.01"
            in capsys.readouterr().err)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_the_removed_weight_flags_name_the_new_form(command, tmp_path, capsys):
    for flag, values, new in (("--del-weight", ["0.001", "0.01"], "--ntl-weight del=0.001 del=0.01"),
                              ("--dist2-weight", ["0.1"], "--ntl-weight dist2=0.1"),
                              ("--smmd-weight", ["1"], "--ntl-weight smmd=1")):
        with pytest.raises(SystemExit) as e:
            cli.main([command, flag, *values, "--out", str(tmp_path)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"error: {flag} was removed in ntl-jax 0.3.0: each loss's weight is --ntl-weight [LOSS=]LAMBDA; " \
               f"use {new}" in err
    # Several at once: one message names them all, and the whole new form.
    with pytest.raises(SystemExit):
        cli.main([command, "--ntl-weight", "0.1", "--del-weight", "0.001", "--smmd-weight", "1", "2", "--out", "x"])
    assert ("error: --del-weight, --smmd-weight were removed in ntl-jax 0.3.0: each loss's weight is --ntl-weight "
            "[LOSS=]LAMBDA; use --ntl-weight del=0.001 smmd=1 smmd=2\n") in capsys.readouterr().err


# The kept comparisons (evidence/, scripts/keep_runs.py) and the settings they declare.
KEPT = ("add_or_sub_past_the_plateau", "diabetes_every_loss", "multiplication_past_the_floor")
KEPT_SINCE_0_3 = ("add_or_sub_ntil", "diabetes_ntil", "multiplication_ntil")  # commands in 0.3.0's form already
REMOVED = {"--del-weight": "del", "--dist2-weight": "dist2", "--smmd-weight": "smmd"}


def new_form(argv: list[str], bare: bool) -> list[str]:
    """An argv of 0.2 with the weight flags 0.3.0 removed in their new form: `--del-weight X`
    -> `--ntl-weight del=X`; an old `--ntl-weight X` (NTL's variants) stays bare (`bare`:
    the others are all named) or names each of NTL's variants where the compared losses
    have other defaults."""
    def values(i):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        return argv[i + 1:j], j

    losses_given, _ = values(argv.index("--losses")) if "--losses" in argv else (["ce", "ntl-was"], 0)
    ntl = [loss for loss in losses_given if systems.trains_ntl(loss) and systems.default_weight(loss) == 0.3]
    others = any(systems.trains_ntl(loss) and systems.default_weight(loss) != 0.3 for loss in losses_given)
    out, weights, i = [], [], 0
    while i < len(argv):
        flag = argv[i]
        if flag in REMOVED or flag == "--ntl-weight":
            given, i = values(i)
            if flag in REMOVED:
                weights += [f"{REMOVED[flag]}={v}" for v in given]
            else:
                weights += [f"{loss}={v}" for loss in ntl for v in given] if others and not bare else given
            continue
        out.append(flag)
        i += 1
    return out + (["--ntl-weight"] + weights if weights else [])


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "named"])
@pytest.mark.parametrize("setting", KEPT)
def test_the_kept_runs_are_finished_runs_of_their_command_in_the_new_form(setting, bare, capsys):
    kept = ROOT / "evidence" / setting
    if not kept.is_dir():
        pytest.skip(f"{kept} is not in this checkout")
    declared = shlex.split(json.loads((ROOT / "docs" / "results" / f"{setting}.json").read_text())["command"])[1:]
    # The recorded command names the removed flags: refused, naming the new form.
    with pytest.raises(SystemExit):
        cli.build_parser(declared).parse_args(declared)
    assert "removed in ntl-jax 0.3.0: each loss's weight is --ntl-weight [LOSS=]LAMBDA; use --ntl-weight " \
        in capsys.readouterr().err
    # Trained at ntl_jax 0.4's normalisation, which a flag repeats.
    argv = new_form(declared, bare) + ["--ntl-mean-over", "targets"]
    assert not set(argv) & set(REMOVED)
    args = cli.build_parser(argv).parse_args(argv)
    if args.task in ("multiplication", "diabetes"):  # as `compare` reads --task
        args.module = args.task
    _, runs = cli_compare.plan(args, str(kept))
    assert len(runs) == sum(1 for _ in kept.glob("*/seed_*/config.json"))
    for spec in runs:
        config = cli_compare._config(args, spec)
        config.validate()
        # What `compare` checks before it trains: the stored identity is this run's, and it finished.
        assert trainer.finished_run(config, cli_compare.run_dir(str(kept), spec)) is not None, spec


@pytest.mark.parametrize("setting", KEPT_SINCE_0_3)
def test_the_kept_runs_of_0_3_are_finished_runs_of_their_command(setting):
    kept = ROOT / "evidence" / setting
    if not kept.is_dir():
        pytest.skip(f"{kept} is not in this checkout")
    argv = shlex.split(json.loads((ROOT / "docs" / "results" / f"{setting}.json").read_text())["command"])[1:]
    argv += ["--ntl-mean-over", "targets"]  # trained at ntl_jax 0.4's normalisation
    args = cli.build_parser(argv).parse_args(argv)
    if args.task in ("multiplication", "diabetes"):  # as `compare` reads --task
        args.module = args.task
    _, runs = cli_compare.plan(args, str(kept))
    assert len(runs) == sum(1 for _ in kept.glob("*/seed_*/config.json")) > 0
    for spec in runs:
        assert trainer.finished_run(cli_compare._config(args, spec), cli_compare.run_dir(str(kept), spec)) is not None
    # At today's normalisation a number loss's run is another run: the kept one is not taken for it.
    args.ntl_mean_over = None
    trained = [spec for spec in runs if systems.trains_ntl(spec.loss)]
    assert trained
    for spec in trained:
        assert trainer.finished_run(cli_compare._config(args, spec), cli_compare.run_dir(str(kept), spec)) is None


KEPT_SINCE_0_5 = ("diabetes_paper_objective",)  # at each loss's authors' normalisation


@pytest.mark.parametrize("setting", KEPT_SINCE_0_5)
def test_the_kept_runs_of_0_5_are_finished_runs_of_their_command_and_not_of_0_4s(setting):
    kept = ROOT / "evidence" / setting
    if not kept.is_dir():
        pytest.skip(f"{kept} is not in this checkout")
    result = json.loads((ROOT / "docs" / "results" / f"{setting}.json").read_text())
    assert {r["ntl_mean_over"] for r in result["runs"]} == {None, "counted"}
    argv = shlex.split(result["command"])[1:]
    args = cli.build_parser(argv).parse_args(argv)
    args.module = args.task if args.task in ("multiplication", "diabetes") else args.module
    _, runs = cli_compare.plan(args, str(kept))
    assert len(runs) == sum(1 for _ in kept.glob("*/seed_*/config.json")) > 0
    for spec in runs:
        assert trainer.finished_run(cli_compare._config(args, spec), cli_compare.run_dir(str(kept), spec)) is not None
    args.ntl_mean_over = "targets"  # 0.4's normalisation is another run
    for spec in [spec for spec in runs if systems.trains_ntl(spec.loss)]:
        assert trainer.finished_run(cli_compare._config(args, spec), cli_compare.run_dir(str(kept), spec)) is None


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "docs" / "results").glob("*.json")))
def test_every_recorded_comparison_plans_its_runs_in_the_new_form(name):
    result = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())
    argv = new_form(shlex.split(result["command"])[1:], bare=True)
    args = cli.build_parser(argv).parse_args(argv)
    if args.task in ("multiplication", "diabetes"):  # as `compare` reads --task
        args.module = args.task
    pretrain, runs = cli_compare.plan(args, args.out)

    def planned(specs):
        return [(s.label, s.loss, s.seed, s.ntl_weight, s.gce_sigma, s.learning_rate, s.steps,
                 os.path.relpath(cli_compare.run_dir(args.out, s), args.out)) for s in specs]

    def recorded(records):
        return [(r["loss"], r["loss_function"], r["seed"], r["ntl_weight"], r.get("gce_sigma"), r["learning_rate"],
                 r["steps"], r["run_dir"]) for r in records]

    assert planned(runs) == recorded(result["runs"])
    assert planned(pretrain) == recorded(result["pretrain_runs"])


OWN_PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "own_loss_package"


def test_ntil_and_a_registered_loss_of_a_package_train_from_the_command_line(real_data, tmp_path):
    """NTIL by its spec, and a loss a package names by an entry point (tests/fixtures/
    own_loss_package): `--loss` reaches each in a process of its own."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(OWN_PACKAGE), os.environ.get("PYTHONPATH", "")]))
    for loss, weight in (("ntil", 0.3), ("squared_gap", 0.3)):
        out = str(tmp_path / loss)
        argv = ["train", "--loss", loss, "--steps", "2", "--out", out] + MICRO
        run = subprocess.run([sys.executable, "-m", "ntl_jax.cli", *argv], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        config = json.load(open(os.path.join(out, "config.json")))
        assert (config["loss"], config["ntl_weight"]) == (loss, weight)
        steps = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "train/ntl" in r]
        assert [r["step"] for r in steps] == [1, 2]
        for r in steps:
            assert np.isfinite(r["train/ntl"]) and r["train/ntl"] > 0
            if loss == "ntil":  # scaled to CE: its term's value is λ·CE
                assert r["train/ntl_term"] == pytest.approx(weight * r["train/cross_entropy"], rel=1e-5)


# Declared in docs/evidence.md and trained in parts: its finished seeds are kept as they come.
IN_PARTS = {"multiplication_paper_objective": (
    "ntl-jax compare --task multiplication --losses ce ntl-was --primary-metric test_interpolate/number_accuracy "
    "--seeds 16 --steps 16000 --jobs 1 --no-progress --out runs/multiplication_paper_objective")}


@pytest.mark.parametrize("setting", sorted(IN_PARTS))
def test_the_seeds_kept_of_a_comparison_in_parts_are_finished_runs_of_its_declared_command(setting):
    kept = ROOT / "evidence" / setting
    if not kept.is_dir():
        pytest.skip(f"{kept} is not in this checkout")
    command = IN_PARTS[setting]
    assert command in (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8")
    argv = shlex.split(command)[1:]
    args = cli.build_parser(argv).parse_args(argv)
    args.module = args.task
    _, runs = cli_compare.plan(args, str(kept))
    present = [spec for spec in runs if os.path.isdir(cli_compare.run_dir(str(kept), spec))]
    assert len(present) == sum(1 for _ in kept.glob("*/seed_*/config.json")) > 0
    assert len(present) % 2 == 0  # both losses of each kept seed
    for spec in present:
        assert trainer.finished_run(cli_compare._config(args, spec), cli_compare.run_dir(str(kept), spec)) is not None
