"""`ntl-jax compare`: pairing by seed, the two protocols, parallel runs, the result file."""

import json
import os
import re

import pytest

pytest.importorskip("flax")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("mathematics_dataset")

from ntl_jax import cli  # noqa: E402
from ntl_jax.cli import compare as cli_compare  # noqa: E402
from ntl_jax.cli import train as cli_train  # noqa: E402

MICRO = ["--preset", "micro", "--train-examples", "16", "--eval-examples", "4",
         "--batch-size", "8", "--log-every", "1", "--checkpoint-every", "2", "--no-progress",
         "--no-tensorboard"]


def _args(argv):
    return cli.build_parser(["compare"] + argv).parse_args(["compare"] + argv)


def _first_step_ce(out, run):
    with open(os.path.join(out, run["run_dir"], "metrics.jsonl")) as f:
        first = json.loads(f.readline())
    assert first["step"] == 1
    return first["train/cross_entropy"]


def test_help_shows_seeds_protocols_and_tasks(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    text = capsys.readouterr().out
    for flag in ("--seeds", "--protocol {scratch,finetune}", "--task {arithmetic,multiplication,diabetes}",
                 "--jobs", "--finetune-learning-rate", "--ntl-weight [LOSS=]LAMBDA [[LOSS=]LAMBDA ...]"):
        assert flag in text
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert "--init-from RUN_DIR" in capsys.readouterr().out


def test_plan_pairs_each_variant_with_the_ce_run_of_its_seed_and_learning_rate(tmp_path):
    args = _args(["--seeds", "2", "--losses", "ntl-was", "ntl-mse", "--ntl-weight", "0.1", "1",
                  "--out", str(tmp_path)])
    pretrain, runs = cli_compare.plan(args, str(tmp_path))
    assert pretrain == []
    assert [(r.label, r.seed, r.baseline) for r in runs] == [
        (label, seed, None if label == "ce" else "ce") for seed in (0, 1)
        for label in ("ce", "ntl-was λ=0.1", "ntl-was λ=1", "ntl-mse λ=0.1", "ntl-mse λ=1")]
    assert [r.ntl_weight for r in runs[:5]] == [0.0, 0.1, 1.0, 0.1, 1.0]

    args = _args(["--protocol", "finetune", "--seeds", "2", "--learning-rate", "0.003",
                  "--finetune-learning-rate", "0.001", "0.0003", "--pretrain-steps", "7",
                  "--steps", "5", "--out", str(tmp_path)])
    pretrain, runs = cli_compare.plan(args, str(tmp_path))
    assert [(p.label, p.seed, p.steps, p.learning_rate, p.loss) for p in pretrain] == [
        ("pretrain-ce", 0, 7, 0.003, "ce"), ("pretrain-ce", 1, 7, 0.003, "ce")]
    assert [(r.label, r.seed, r.baseline, r.learning_rate, r.steps) for r in runs[:4]] == [
        ("ce lr=0.001", 0, None, 0.001, 5), ("ntl-was lr=0.001", 0, "ce lr=0.001", 0.001, 5),
        ("ce lr=0.0003", 0, None, 0.0003, 5), ("ntl-was lr=0.0003", 0, "ce lr=0.0003", 0.0003, 5)]
    assert {r.init_from for r in runs if r.seed == 1} == {cli_compare.run_dir(str(tmp_path),
                                                                              pretrain[1])}
    # The default fine-tuning rate is a third of the pretraining rate.
    args = _args(["--protocol", "finetune", "--learning-rate", "0.003", "--out", str(tmp_path)])
    assert {r.learning_rate for r in cli_compare.plan(args, str(tmp_path))[1]} == {0.001}
    # Fine-tuning starts from CE's network on the shipped vocabulary: the baselines with a
    # network or vocabulary of their own are refused before anything trains.
    args = _args(["--protocol", "finetune", "--losses", "gce", "ntl-was-cdf", "--out", str(tmp_path)])
    assert [r.loss for r in cli_compare.plan(args, str(tmp_path))[1] if r.seed == 0] == ["ce", "gce", "ntl-was-cdf"]
    for baseline in ("rt", "rt+ntl-mse", "xval", "regression-head"):
        args = _args(["--protocol", "finetune", "--losses", "ntl-was", baseline, "--out", str(tmp_path)])
        with pytest.raises(ValueError, match=f"expected token-head losses on it, got {re.escape(baseline)} "):
            cli_compare.plan(args, str(tmp_path))


def test_scratch_runs_of_a_seed_share_initialisation_and_batches(tmp_path, capsys):
    out = str(tmp_path / "cmp")
    argv = ["compare", "--steps", "2", "--seeds", "2", "--out", out] + MICRO
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "ntl-was − ce" in printed or "ntl-was - ce" in printed
    result = json.load(open(os.path.join(out, "compare.json")))
    assert result["command"] == "ntl-jax " + " ".join(argv)
    assert {"jax", "flax", "optax", "python"} <= set(result["versions"])
    runs = {(r["loss"], r["seed"]): r for r in result["runs"]}
    assert set(runs) == {("ce", 0), ("ntl-was", 0), ("ce", 1), ("ntl-was", 1)}
    # Step 1's cross-entropy is computed before any update: equal init and batch give
    # the same value whatever the loss; another seed gives another value.
    for seed in (0, 1):
        assert _first_step_ce(out, runs["ce", seed]) == _first_step_ce(out, runs["ntl-was", seed])
    assert _first_step_ce(out, runs["ce", 0]) != _first_step_ce(out, runs["ce", 1])
    paired = result["paired"]["ntl-was"]["test_interpolate/number_accuracy"]
    assert paired["n"] == 2 and len(paired["ci95"]) == 2
    diffs = [runs["ntl-was", s]["metrics"]["test_interpolate/number_accuracy"]
             - runs["ce", s]["metrics"]["test_interpolate/number_accuracy"] for s in (0, 1)]
    assert paired["mean_diff"] == pytest.approx(sum(diffs) / 2)
    assert result["summary"]["ce"]["test_interpolate/number_accuracy"]["n"] == 2
    assert os.path.getsize(os.path.join(out, "compare.png")) > 10_000
    # Rerunning reuses every finished run.
    assert cli.main(argv) == 0
    again = json.load(open(os.path.join(out, "compare.json")))
    assert again["runs"] == result["runs"]


def test_finetune_starts_every_loss_from_the_seed_s_pretrained_parameters(tmp_path):
    out = str(tmp_path / "ft")
    argv = ["compare", "--protocol", "finetune", "--steps", "2", "--pretrain-steps", "2",
            "--seeds", "1", "--out", out] + MICRO
    assert cli.main(argv) == 0
    result = json.load(open(os.path.join(out, "compare.json")))
    (pre,) = result["pretrain_runs"]
    assert pre["loss"] == "pretrain-ce" and pre["steps"] == 2
    runs = {r["loss"]: r for r in result["runs"]}
    assert runs["ce"]["init_from"] == runs["ntl-was"]["init_from"] == pre["run_dir"]
    assert runs["ce"]["learning_rate"] == pytest.approx(3e-3 / 3)
    # Both fine-tunings start from the same pretrained parameters, which (after two
    # updates) fit the first batch differently than the random initialisation did.
    assert _first_step_ce(out, runs["ce"]) == _first_step_ce(out, runs["ntl-was"])
    assert _first_step_ce(out, runs["ce"]) != _first_step_ce(out, pre)


def test_parallel_runs_give_the_same_results_as_one_process(tmp_path):
    common = ["compare", "--steps", "2", "--seeds", "1", "--losses", "ce", "ntl-mse"] + MICRO
    assert cli.main(common + ["--out", str(tmp_path / "one")]) == 0
    assert cli.main(common + ["--out", str(tmp_path / "two"), "--jobs", "2"]) == 0
    one = json.load(open(tmp_path / "one" / "compare.json"))
    two = json.load(open(tmp_path / "two" / "compare.json"))
    assert [(r["loss"], r["metrics"]) for r in one["runs"]] == \
        [(r["loss"], r["metrics"]) for r in two["runs"]]


def test_an_interrupted_parallel_compare_starts_no_queued_run(tmp_path, capsys, monkeypatch):
    import concurrent.futures
    import threading
    import time

    from ntl_jax.train import trainer

    started, lock = [], threading.Lock()

    def train_one(args, spec, out, progress):
        with lock:
            started.append(spec)
            first = len(started) == 1
        if first:
            time.sleep(0.1)
            raise trainer.Interrupted(1, "somewhere/1")
        time.sleep(0.5)
        return {"eval": {}}

    def threads(jobs, mp_context=None):  # the pool's logic without processes
        return concurrent.futures.ThreadPoolExecutor(jobs)

    monkeypatch.setattr(cli_compare, "_train_one", train_one)
    monkeypatch.setattr(cli_compare.concurrent.futures, "ProcessPoolExecutor", threads)
    argv = ["compare", "--steps", "2", "--seeds", "3", "--jobs", "2", "--out", str(tmp_path)] + MICRO
    assert cli.main(argv) == 130
    assert "interrupted; rerun the same command to resume" in capsys.readouterr().err
    # The two running, and at most one a freed worker took before the queue was
    # cancelled (a process pool also hands one call ahead to its workers); without the
    # cancellation all six start.
    assert 2 <= len(started) <= 3


def test_interrupted_compare_exits_130_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    from ntl_jax.train import trainer

    def interrupted(*args, **kwargs):
        raise trainer.Interrupted(5, "somewhere/5")

    monkeypatch.setattr(trainer, "train", interrupted)
    assert cli.main(["compare", "--steps", "2", "--out", str(tmp_path)] + MICRO) == 130
    assert "interrupted; rerun the same command to resume" in capsys.readouterr().err


def test_del_dist2_and_smmd_take_their_own_weights_and_are_swept_by_them(tmp_path):
    args = _args(["--losses", "ntl-was", "del", "dist2", "gce+del", "--ntl-weight", "del=0.001", "del=0.1",
                  "--seeds", "1", "--out", str(tmp_path)])
    runs = cli_compare.plan(args, str(tmp_path))[1]
    assert [(r.label, r.loss, r.ntl_weight) for r in runs] == [
        ("ce", "ce", 0.0), ("ntl-was", "ntl-was", 0.3), ("del λ=0.001", "del", 0.001),
        ("del λ=0.1", "del", 0.1), ("dist2", "dist2", 0.1), ("gce+del λ=0.001", "gce+del", 0.001),
        ("gce+del λ=0.1", "gce+del", 0.1)]
    assert [cli_compare._config(args, r).ntl_weight for r in runs[:3]] == [0.0, 0.3, 0.001]
    train = cli.build_parser(["train"]).parse_args(["train", "--loss", "dist2", "--out", "x"])
    assert cli_train.make_config(train, "dist2", 0).ntl_weight == 0.1
    assert cli_train.make_config(train, "smmd", 0).ntl_weight == 1.0
    args = _args(["--losses", "smmd", "gce+smmd", "--ntl-weight", "smmd=0.3", "smmd=1", "--seeds", "1",
                  "--out", str(tmp_path)])
    assert [(r.label, r.loss, r.ntl_weight) for r in cli_compare.plan(args, str(tmp_path))[1]] == [
        ("ce", "ce", 0.0), ("smmd λ=0.3", "smmd", 0.3), ("smmd λ=1", "smmd", 1.0),
        ("gce+smmd λ=0.3", "gce+smmd", 0.3), ("gce+smmd λ=1", "gce+smmd", 1.0)]
    assert cli_train.make_config(train, "ntl-mse", 0).ntl_weight == 0.3
    with pytest.raises(SystemExit):
        _args(["--losses", "ntl-del"])  # the successors go by their own names


def test_gce_sigma_is_swept_for_the_gce_losses_only(tmp_path):
    args = _args(["--losses", "ntl-was", "gce", "gce+ntl-was", "--ntl-weight", "0.1", "1",
                  "--gce-sigma", "0.5", "2", "--seeds", "1", "--out", str(tmp_path)])
    runs = cli_compare.plan(args, str(tmp_path))[1]
    assert [(r.label, r.ntl_weight, r.gce_sigma) for r in runs] == [
        ("ce", 0.0, None), ("ntl-was λ=0.1", 0.1, None), ("ntl-was λ=1", 1.0, None),
        ("gce σ=0.5", 0.0, 0.5), ("gce σ=2", 0.0, 2.0),
        ("gce+ntl-was λ=0.1 σ=0.5", 0.1, 0.5), ("gce+ntl-was λ=0.1 σ=2", 0.1, 2.0),
        ("gce+ntl-was λ=1 σ=0.5", 1.0, 0.5), ("gce+ntl-was λ=1 σ=2", 1.0, 2.0)]
    assert [cli_compare._config(args, r).gce_sigma for r in runs[3:6]] == [0.5, 2.0, 0.5]
    assert {cli_compare.run_dir(str(tmp_path), r) for r in runs[3:5]} == {
        str(tmp_path / "gce_sigma=0.5" / "seed_0"), str(tmp_path / "gce_sigma=2" / "seed_0")}
    # One σ (or none): one gce run per seed, named as before, at that σ (or the default).
    for argv, sigma in ((["--gce-sigma", "2"], 2.0), ([], 1.0)):
        args = _args(["--losses", "gce", "--seeds", "1", "--out", str(tmp_path)] + argv)
        runs = cli_compare.plan(args, str(tmp_path))[1]
        assert [r.label for r in runs] == ["ce", "gce"]
        assert cli_compare._config(args, runs[1]).gce_sigma == sigma
    train = cli.build_parser(["train"]).parse_args(["train", "--loss", "gce", "--gce-sigma", "3",
                                                    "--out", "x"])
    assert cli_train.make_config(train, "gce", 0).gce_sigma == 3.0


@pytest.mark.parametrize("panels, grid", [(1, (1, 1)), (3, (3, 1)), (4, (3, 2)), (5, (3, 2)),
                                          (7, (3, 3))])
def test_the_figure_wraps_its_panels_in_rows_of_three(panels, grid):
    assert cli_compare.figure_grid(panels) == grid


def test_also_against_takes_a_compared_loss_other_than_ce(tmp_path, capsys):
    for wrong in ("ce", "del"):
        assert cli.main(["compare", "--losses", "ce", "ntl-was", "--also-against", wrong,
                         "--out", str(tmp_path / wrong)] + MICRO) == 2
        assert f"--also-against expected losses of --losses other than ce (ntl-was), got {wrong}" \
            in capsys.readouterr().err


def test_validation_split_scores_held_out_training_problems(tmp_path):
    from ntl_jax.train import data as data_lib

    out = str(tmp_path / "sweep")
    assert cli.main(["compare", "--task", "multiplication", "--losses", "dist2",
                     "--ntl-weight", "dist2=0.03", "dist2=0.3", "--eval-split", "validation", "--steps", "2",
                     "--seeds", "1", "--out", out] + MICRO) == 0
    with open(os.path.join(out, "compare.json")) as f:
        result = json.load(f)
    assert result["table_metrics"] == ["validation/number_accuracy", "validation/mape",
                                       "validation/log_mae"]
    assert {r["loss"] for r in result["runs"]} == {"ce", "dist2 λ=0.03", "dist2 λ=0.3"}
    assert not any(k.startswith("test_") for r in result["runs"] for k in r["metrics"])
    config = data_lib.DataConfig(module="multiplication", train_examples=16, eval_examples=4,
                                 batch_size=8, seed=0, architecture="decoder-only",
                                 eval_split="validation")
    data = data_lib.ProblemData(config)
    pool = data_lib.default_example_source()("multiplication", "train", 16, 0)
    held_out = data_lib.validation_examples(data_lib.default_example_source(), "multiplication", 4, pool)
    assert list(data.eval_sets) == ["validation"] and data.eval_sets["validation"].questions == [
        q for q, _ in held_out]
    assert not {q for q, _ in pool} & set(data.eval_sets["validation"].questions)
    # Every problem it drew is in the pool: none left.
    with pytest.raises(ValueError, match="expected 4 validation problems outside the training pool, "
                                         "found 0 among 8 drawn"):
        data_lib.validation_examples(lambda *a: pool[:8], "multiplication", 4, pool)
    with pytest.raises(ValueError, match="got 'diabetes': its patients are split once"):
        data_lib.validation_examples(lambda *a: pool, "diabetes", 4, pool)


def test_primary_metric_is_one_of_the_tables_metrics(tmp_path, capsys):
    assert cli.main(["compare", "--losses", "ce", "ntl-was", "--primary-metric", "validation/mape",
                     "--out", str(tmp_path / "wrong")] + MICRO) == 2
    assert ("--primary-metric expected one of the table's metrics (test_interpolate/number_accuracy, "
            in capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "wrong")


def test_only_seeds_trains_a_part_that_the_whole_command_reuses(tmp_path, capsys):
    common = ["compare", "--steps", "2", "--seeds", "3", "--losses", "ce", "ntl-mse",
              "--out", str(tmp_path)] + MICRO
    assert cli.main(common + ["--only-seeds", "2", "0"]) == 0
    assert "trained seed(s) 0, 2 of 3: 4 run(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "ce").iterdir()) == ["seed_0", "seed_2"]
    assert sorted(p.name for p in (tmp_path / "ntl-mse").iterdir()) == ["seed_0", "seed_2"]
    assert not (tmp_path / "compare.json").exists()  # a part has no summary

    assert cli.main(common) == 0
    result = json.load(open(tmp_path / "compare.json"))
    assert [(r["loss"], r["seed"]) for r in result["runs"]] == [
        (loss, seed) for seed in range(3) for loss in ("ce", "ntl-mse")]
    assert result["reused_runs"] == 4  # the part's runs, not trained again


def test_only_seeds_outside_the_comparison_is_refused(tmp_path, capsys):
    assert cli.main(["compare", "--seeds", "3", "--only-seeds", "1", "3", "-1",
                     "--out", str(tmp_path / "part")] + MICRO) == 2
    assert "--only-seeds takes seeds of 0..2 (--seeds 3); got -1, 3" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "part")


def test_the_summary_names_the_machine_of_each_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_compare, "machine_name", lambda: "here, 2 cores, JAX on CPU")
    recorded = cli_compare.read_machines(str(tmp_path))
    assert recorded == {}
    assert cli_compare._machines(recorded, [0, 1, 2, 0]) == "here, 2 cores, JAX on CPU"
    (tmp_path / "machines.json").write_text(json.dumps(
        {"seed_0": "here, 2 cores, JAX on CPU", "seed_3": "there, JAX on GPU", "seed_4": "there, JAX on GPU",
         "seed_6": "there, JAX on GPU"}))
    assert cli_compare._machines(cli_compare.read_machines(str(tmp_path)), list(range(8))) == (
        "here, 2 cores, JAX on CPU (seeds 0–2, 5, 7); there, JAX on GPU (seeds 3–4, 6)")


@pytest.mark.parametrize("content", ['{"seed_0": ', '["here"]', '{"0": "here"}', '{"seed_0": 3}'])
def test_a_broken_machines_file_is_refused_before_any_run(tmp_path, capsys, content):
    (tmp_path / "machines.json").write_text(content)
    assert cli.main(["compare", "--steps", "2", "--out", str(tmp_path)] + MICRO) == 2
    assert "machines.json: expected a JSON object of seed_<k>: machine, got" in capsys.readouterr().err
    assert not (tmp_path / "ce").exists()
