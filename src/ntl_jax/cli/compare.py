"""`ntl-jax compare`: CE against CE + NTL and the paper's other systems, paired by seed,
with confidence intervals.

Every seed gives all losses (and the baselines of `ntl_jax.train.systems`) the same
initialisation and the same batches, so each run has a CE twin and the comparison is a
set of paired differences. Two protocols:

* `scratch`: every loss trains from a random initialisation.
* `finetune` (the paper's): per seed, one CE pretraining run; then every loss
  fine-tunes from those same parameters at the fine-tuning learning rate(s).

`--ntl-weight` (`LOSS=LAMBDA` for one loss; by default each loss's own: 0.3 for NTL, 0.001
for DEL, 0.1 for DIST², 1 for SMMD), `--gce-sigma` and
`--finetune-learning-rate` take several values to sweep them, and `--eval-split
validation` scores the runs on held-out training-like problems to choose among them
without the tests; each NTL variant is paired with the CE run of the same seed and learning rate. Runs live in
`<out>/<variant>/seed_<k>/`; rerunning the command resumes unfinished runs and reuses
finished ones. `--jobs N` trains N runs at a time in separate processes.

Writes `<out>/compare.json` (every run, per-variant summaries, paired differences with
95 % Student t intervals and Wilcoxon / sign-test p-values, the command and versions),
`compare.md` (the table, with Holm-adjusted p-values and verdicts) and `compare.png`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import platform
import re
import shlex
import sys
import time

import numpy as np

from ntl_jax.cli import flags as cli_flags
from ntl_jax.cli import train as cli_train
from ntl_jax.train import data as data_lib
from ntl_jax.train import loss_names, systems
from ntl_jax.train.loss_names import GCE_PREFIX
from ntl_jax.train.machine import cpu_model

TASKS = ("arithmetic", "multiplication", "diabetes")
PROTOCOLS = ("scratch", "finetune")
LOSSES = ("ce", loss_names.DEFAULT)
# Metrics shown in tables and figures, per task.
TABLE_METRICS = {
    "arithmetic": ("test_interpolate/number_accuracy", "test_interpolate/log_mae",
                   "test_extrapolate/number_accuracy", "test_extrapolate/log_mae"),
    # MAPE as the paper reports it; log-MAE too, because one wild answer can dominate a MAPE.
    "multiplication": ("test_interpolate/number_accuracy", "test_interpolate/mape",
                       "test_interpolate/log_mae", "test_extrapolate/number_accuracy",
                       "test_extrapolate/mape", "test_extrapolate/log_mae"),
    # A regression task: the error and correlation of the predicted scores.
    "diabetes": ("test_interpolate/rmse", "test_interpolate/pearson_r",
                 "test_interpolate/log_mae", "test_interpolate/parsed"),
}
# The default budget (3 seeds x 2 losses x 1,000 steps) is sized to finish in under 10
# minutes on 2 CPU cores; the result files in docs/results name their larger budgets explicitly.
DEFAULTS = dict(cli_train.DEFAULTS, steps=1000)
# Under --out: the machines that trained seeds reused from elsewhere (scripts/keep_runs.py).
MACHINES = "machines.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="ntl_compare",
                        help="directory for the runs, table and figure (default: %(default)s)")
    parser.add_argument("--task", choices=TASKS, default="arithmetic",
                        help="arithmetic: a DeepMind module (--module) with the encoder-decoder; "
                             "multiplication: k-digit x l-digit products with a decoder-only "
                             "model; diabetes: scikit-learn's diabetes regression data with the "
                             "encoder-decoder (default: %(default)s)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="scratch",
                        help="scratch: each loss trains from random initialisation; finetune: "
                             "CE pretraining per seed, then each loss fine-tunes from the same "
                             "parameters (default: %(default)s)")
    parser.add_argument("--seeds", type=cli_flags.positive_int, default=3,
                        help="number of seeds, 0..N-1; a seed fixes initialisation and data "
                             "order for every loss (default: %(default)s)")
    parser.add_argument("--losses", nargs="+", type=cli_train.system, default=list(LOSSES),
                        metavar="LOSS",
                        help="losses to compare, each as `ntl-jax train --loss` takes it: ce, gce, a number loss "
                             f"({', '.join(cli_train.NUMBER_LOSSES)}; its parameters in parentheses as in its spec, "
                             f"e.g. 'smmd(mode=mmd)'), gce+<number loss>, {', '.join(systems.BASELINES)}; "
                             "'ce' is the baseline and always runs (default: ce ntl-was)")
    parser.add_argument("--jobs", type=cli_flags.positive_int, default=1,
                        help="runs trained at the same time, in separate processes "
                             "(default: %(default)s)")
    parser.add_argument("--only-seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="train only these seeds' runs, of 0..--seeds - 1, and write no "
                             "summary: a part of the comparison for another machine, whose "
                             "finished runs the whole command then reuses (default: every seed)")
    g = parser.add_argument_group("finetune protocol")
    g.add_argument("--pretrain-steps", type=cli_flags.positive_int, default=None,
                   help="CE pretraining steps (default: --steps)")
    g.add_argument("--finetune-learning-rate", type=cli_flags.positive_float, nargs="+",
                   default=None, metavar="LR",
                   help="fine-tuning learning rate(s); --learning-rate is pretraining's "
                        "(default: a third of --learning-rate)")
    g = parser.add_argument_group("reporting")
    g.add_argument("--high-mode-threshold", default=0.6,
                   type=cli_flags.checked(float, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
                   help="also report the share of seeds whose interpolation accuracy exceeds "
                        "this (a run's accuracy tends to end either low or high, depending on "
                        "its seed) (default: %(default)s)")
    g.add_argument("--also-against", nargs="+", type=cli_train.system, default=[], metavar="LOSS",
                   help="also pair every other loss with LOSS's run of its seed (e.g. ntl-was, "
                        "to compare its successors with it), adjusted with the comparisons "
                        "against CE as one family (default: CE only)")
    g.add_argument("--primary-metric", default=None, metavar="METRIC",
                   help="the metric declared primary before the runs: only its comparisons "
                        "form the family Holm adjusts and get a verdict; the table's other "
                        "metrics are shown with their intervals and unadjusted p-values "
                        "(default: every metric of the table, one family)")
    cli_train.add_run_arguments(parser, DEFAULTS, sweep=True)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run of a comparison."""

    label: str  # variant name in tables, e.g. "ntl-was λ=0.3"
    loss: str
    seed: int
    ntl_weight: float
    learning_rate: float
    steps: int
    baseline: str | None  # label of the CE run this one is paired with; None: unpaired
    init_from: str = ""  # run directory whose final parameters start this run
    gce_sigma: float | None = None  # the gce losses' σ; None: the default


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", label.replace("λ", "lambda").replace("σ", "sigma").replace(" ", "_"))


def run_dir(out: str, spec: RunSpec) -> str:
    return os.path.join(out, _slug(spec.label), f"seed_{spec.seed}")


def plan(args: argparse.Namespace, out: str) -> tuple[list[RunSpec], list[RunSpec]]:
    """(pretraining runs, compared runs) of the comparison, or of its `--only-seeds`, in the
    order they train."""
    from ntl_jax.train.step import uses_gce
    from ntl_jax.train.systems import starts_from_ce, trains_ntl

    losses = ["ce"] + [loss for loss in dict.fromkeys(args.losses) if loss != "ce"]
    check_weights(args, losses)
    if args.protocol == "finetune" and not all(starts_from_ce(loss) for loss in losses):
        own = [loss for loss in losses if not starts_from_ce(loss)]
        raise ValueError(f"--protocol finetune starts every run from a CE model of the shipped "
                         f"vocabulary; expected token-head losses on it, got {', '.join(own)} (a "
                         f"network or vocabulary of their own): use --protocol scratch")
    def weights(loss):  # a system without NTL has no weight: one run per seed
        return _weights(args, loss) if trains_ntl(loss) else [0.0]

    def sigmas(loss):  # a loss without the Gaussian label has no σ: one run per seed
        return list(dict.fromkeys(args.gce_sigma or [None])) if uses_gce(loss) else [None]

    if args.protocol == "finetune":
        rates = list(dict.fromkeys(args.finetune_learning_rate or [args.learning_rate / 3]))
    else:
        rates = [args.learning_rate]

    def label(loss, weight, sigma, rate):
        text = loss
        if len(weights(loss)) > 1:
            text += f" λ={weight:g}"
        if len(sigmas(loss)) > 1:
            text += f" σ={sigma:g}"
        if len(rates) > 1:
            text += f" lr={rate:g}"
        return text

    pretrain, runs = [], []
    for seed in sorted(set(args.only_seeds)) if args.only_seeds is not None else range(args.seeds):
        init_from = ""
        if args.protocol == "finetune":
            pre = RunSpec("pretrain-ce", "ce", seed, 0.0, args.learning_rate,
                          args.pretrain_steps or args.steps, None)
            pretrain.append(pre)
            init_from = run_dir(out, pre)
        for rate in rates:
            base = label("ce", 0.0, None, rate)
            for loss in losses:
                for weight in weights(loss):
                    for sigma in sigmas(loss):
                        runs.append(RunSpec(label(loss, weight, sigma, rate), loss, seed, weight,
                                            rate, args.steps, None if loss == "ce" else base,
                                            init_from, sigma))
    return pretrain, runs


def _named(given: list, loss: str) -> list[float]:
    """The `--ntl-weight LOSS=LAMBDA` values of `loss`: those naming it, else for
    "gce+<loss>" those naming "<loss>" (as the plain loss's weight, the default's key)."""
    for name in (loss, loss.removeprefix(GCE_PREFIX)):
        values = [w.value for w in given if w.loss == name]
        if values:
            return values
    return []


def _weights(args: argparse.Namespace, loss: str) -> list[float]:
    """The weights `loss` is trained at: its own `--ntl-weight LOSS=LAMBDA` values (`_named`),
    else the plain `--ntl-weight LAMBDA` ones, else its default (`systems.default_weight`)."""
    given = args.ntl_weight or []
    every = [w.value for w in given if w.loss is None]
    return list(dict.fromkeys(_named(given, loss) or every or [systems.default_weight(loss)]))


def check_weights(args: argparse.Namespace, losses: list[str]) -> None:
    """Raises ValueError if `--ntl-weight LOSS=LAMBDA` names no compared loss with a
    weight, or a plain `--ntl-weight LAMBDA` would set losses of different default
    weights alike (name each instead)."""
    given = args.ntl_weight or []
    weighted = [loss for loss in losses if systems.trains_ntl(loss)]
    names = set(weighted) | {loss.removeprefix(GCE_PREFIX) for loss in weighted}
    wrong = list(dict.fromkeys(str(w) for w in given if w.loss is not None and w.loss not in names))
    if wrong:
        raise ValueError(f"--ntl-weight LOSS=LAMBDA expected LOSS one of the compared losses with a weight "
                         f"({', '.join(weighted) or 'none'}), got {' '.join(wrong)}")
    every = [str(w) for w in given if w.loss is None]
    unnamed = [loss for loss in weighted if not _named(given, loss)]
    if every and len({systems.default_weight(loss) for loss in unnamed}) > 1:
        defaults = ", ".join(f"{loss} {systems.default_weight(loss):g}" for loss in unnamed)
        raise ValueError(f"--ntl-weight {' '.join(every)} would weigh losses of different default weights "
                         f"({defaults}) alike; expected each named: --ntl-weight "
                         + " ".join(f"{loss}=LAMBDA" for loss in unnamed))


def _config(args: argparse.Namespace, spec: RunSpec):
    sigma = {} if spec.gce_sigma is None else {"gce_sigma": spec.gce_sigma}
    return cli_train.make_config(
        args, spec.loss, spec.seed, ntl_weight=spec.ntl_weight,
        learning_rate=spec.learning_rate, steps=spec.steps, init_from=spec.init_from, **sigma)


# Per process: the generated data of each seed, shared by all runs of that seed.
_DATA: dict = {}


def _train_one(args: argparse.Namespace, spec: RunSpec, out: str, progress: bool) -> dict:
    from ntl_jax.train import systems
    from ntl_jax.train.trainer import finished_run, train

    config = _config(args, spec)
    finished = finished_run(config, run_dir(out, spec))
    if finished is not None:
        return finished | {"reused": True}
    key = (config.data, systems.vocabulary_name(spec.loss))  # RT tokenizes its own way
    if key not in _DATA:
        if not any(k[0] == config.data for k in _DATA):
            _DATA.clear()  # one seed's data at a time is enough: runs are ordered by seed
            print(f"seed {spec.seed}: generating {config.data.train_examples} training problems "
                  f"of {config.data.module} ...", flush=True)
        _DATA[key] = data_lib.ProblemData(config.data, vocabulary=systems.vocabulary(spec.loss))
    result = train(config, run_dir(out, spec), data=_DATA[key], progress=progress,
                   tensorboard=not args.no_tensorboard)
    result.pop("state", None)
    return result


def _execute(args: argparse.Namespace, out: str, pretrain: list[RunSpec],
             runs: list[RunSpec]) -> dict[RunSpec, dict]:
    """Trains every run (pretraining first where a run starts from it)."""
    results: dict[RunSpec, dict] = {}
    progress = not args.no_progress
    if args.jobs == 1:
        for spec in pretrain + runs:
            print(f"[{len(results) + 1}/{len(pretrain) + len(runs)}] {spec.label}, seed "
                  f"{spec.seed}", flush=True)
            results[spec] = _train_one(args, spec, out, progress)
        return results
    # Separate processes (spawned: forking a process with JAX threads can deadlock).
    context = multiprocessing.get_context("spawn")
    waiting = list(runs)
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        pending = {pool.submit(_train_one, args, s, out, False): s for s in pretrain}
        ready: set[str] = set()  # pretraining runs that have finished

        def submit_ready():
            for spec in [s for s in waiting if not s.init_from or s.init_from in ready]:
                waiting.remove(spec)
                pending[pool.submit(_train_one, args, spec, out, False)] = spec

        try:
            submit_ready()
            while pending:
                done, _ = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
                for future in done:
                    spec = pending.pop(future)
                    results[spec] = future.result()
                    print(f"[{len(results)}/{len(pretrain) + len(runs)}] finished {spec.label}, "
                          f"seed {spec.seed}", flush=True)
                    if spec in pretrain:
                        ready.add(run_dir(out, spec))
                submit_ready()
        except BaseException:
            # Ctrl-C, or a run that stopped (interrupted, diverged): queued runs must not
            # start; the running ones stop at their own Ctrl-C (the terminal sends it to
            # every process) or finish.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ("ntl-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_name() -> str:
    import jax

    device = jax.devices()[0]
    cores = f"{cpu_model()}, {os.cpu_count()} cores"
    if device.platform == "cpu":
        return f"{cores}, JAX on CPU"
    return f"{cores}, JAX on {getattr(device, 'device_kind', device.platform)}"


def read_machines(out: str) -> dict[str, str]:
    """`<out>/machines.json`: `{"seed_<k>": machine}` for the seeds trained elsewhere
    (written by scripts/keep_runs.py); empty if there is none."""
    path = os.path.join(out, MACHINES)
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            recorded = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: expected a JSON object of seed_<k>: machine, got "
                         f"unreadable content ({e})") from e
    if not (isinstance(recorded, dict) and all(
            re.fullmatch(r"seed_\d+", k) and isinstance(v, str) for k, v in recorded.items())):
        raise ValueError(f"{path}: expected a JSON object of seed_<k>: machine, got {recorded!r:.200}")
    return recorded


def _machines(recorded: dict[str, str], seeds: list[int]) -> str:
    """The machine that trained each seed: `recorded` (`read_machines`), else this one."""
    here = machine_name()
    by_machine: dict[str, list[int]] = {}
    for seed in sorted(set(seeds)):
        by_machine.setdefault(recorded.get(f"seed_{seed}", here), []).append(seed)
    if len(by_machine) == 1:
        return next(iter(by_machine))
    return "; ".join(f"{machine} (seeds {_seed_ranges(group)})" for machine, group in by_machine.items())


def _seed_ranges(seeds: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0–2, 5, 7–8"."""
    spans: list[list[int]] = []
    for s in seeds:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)


def _run_record(args: argparse.Namespace, spec: RunSpec, result: dict, out: str) -> dict:
    return {"loss": spec.label, "loss_function": spec.loss, "seed": spec.seed,
            "baseline": spec.baseline, "ntl_weight": spec.ntl_weight,
            "ntl_mean_over": _config(args, spec).mean_over(),
            "gce_sigma": spec.gce_sigma,
            "learning_rate": spec.learning_rate, "steps": spec.steps,
            "init_from": os.path.relpath(spec.init_from, out) if spec.init_from else None,
            "run_dir": os.path.relpath(run_dir(out, spec), out),
            "metrics": result.get("eval", {}), "seconds": result.get("seconds")}


def build_result(args: argparse.Namespace, argv: list[str] | None, out: str,
                 pretrain: list[RunSpec], runs: list[RunSpec],
                 results: dict[RunSpec, dict], seconds: float, machines: dict[str, str]) -> dict:
    """The content of compare.json; `machines` as `read_machines` gives them."""
    from ntl_jax.train import paired_stats

    records = [_run_record(args, s, results[s], out) for s in runs]
    metrics = sorted({k for r in records for k in r["metrics"]})
    shown = [m for m in table_metrics(args) if m in metrics]
    thresholds = {f"{split}/number_accuracy": args.high_mode_threshold
                  for split in ("test_interpolate", data_lib.VALIDATION)}
    title = (f"{args.task} ({args.module}, {cli_train.architecture(args)}), preset {args.preset}, "
             f"{args.protocol}: " + (f"CE pretraining {args.pretrain_steps or args.steps} steps"
                                     f" at lr {args.learning_rate:g}, then "
                                     if args.protocol == "finetune" else "")
             + f"{args.steps} steps x batch {args.batch_size}, {args.seeds} paired seeds")
    command = "ntl-jax " + shlex.join(argv) if argv is not None else None
    return {
        "title": title, "command": command,
        "machine": _machines(machines, [s.seed for s in runs]), "versions": _versions(),
        "seconds": seconds,
        # Training time of every run, also of runs finished by an earlier invocation.
        "run_seconds": sum(r.get("seconds") or 0.0 for r in results.values()),
        "reused_runs": sum(bool(r.get("reused")) for r in results.values()),
        "total_runs": len(results),
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "table_metrics": shown,
        "primary_metric": args.primary_metric,
        "runs": records,
        "pretrain_runs": [_run_record(args, s, results[s], out) for s in pretrain],
        "summary": paired_stats.describe(records, metrics=metrics, thresholds=thresholds),
        "paired": paired_stats.paired_comparison(records, metrics=metrics),
    }


def check_also_against(args: argparse.Namespace) -> None:
    """Raises ValueError if an `--also-against` loss is CE or not one of `--losses`."""
    wrong = [loss for loss in args.also_against if loss == "ce" or loss not in args.losses]
    if wrong:
        raise ValueError(f"--also-against expected losses of --losses other than ce "
                         f"({', '.join(loss for loss in args.losses if loss != 'ce')}), got "
                         f"{', '.join(wrong)}")


def check_primary_metric(args: argparse.Namespace) -> None:
    """Raises ValueError if `--primary-metric` is not one of the table's metrics."""
    metrics = table_metrics(args)
    if args.primary_metric is not None and args.primary_metric not in metrics:
        raise ValueError(f"--primary-metric expected one of the table's metrics ({', '.join(metrics)}), "
                         f"got {args.primary_metric}")


def table_metrics(args: argparse.Namespace) -> list[str]:
    """The task's metrics on the splits the runs are scored on: its test splits, or
    with `--eval-split validation` the interpolation metrics on the validation split."""
    if getattr(args, "eval_split", "test") != data_lib.VALIDATION:
        return list(TABLE_METRICS[args.task])
    return [data_lib.VALIDATION + "/" + m.split("/", 1)[1] for m in TABLE_METRICS[args.task]
            if m.startswith("test_interpolate/")]


def _earlier_seconds(path: str, result: dict) -> list[float]:
    """Wall times of the earlier invocations whose runs this one reused: those recorded
    in the comparison's previous compare.json (same title, so same runs)."""
    if not result["reused_runs"] or not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            previous = json.load(f)
    except (OSError, ValueError):
        return []
    if previous.get("title") != result["title"]:
        return []
    return list(previous.get("earlier_seconds") or []) + [previous["seconds"]]


def seed_lines(result: dict, metric: str, labels: list[str]) -> dict[int, tuple[list[float], list[float]]]:
    """Per seed, the points of its runs in a metric's panel: x is the label's index plus
    the seed's own offset (the same for every label), y the metric (NaN where missing, so
    the seed's line breaks there). One line per seed through them shows the pairing."""
    per_label = {label: dict(zip(result["summary"][label][metric]["seeds"],
                                 result["summary"][label][metric]["values"])) for label in labels}
    seeds = sorted({s for values in per_label.values() for s in values})
    offsets = np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [0.0]
    return {seed: ([i + float(offset) for i in range(len(labels))],
                   [math.nan if per_label[label].get(seed) is None else float(per_label[label][seed])
                    for label in labels])
            for seed, offset in zip(seeds, offsets)}


# Panels per row of the figure: three keep it narrow enough that a documentation page
# shows its labels at about their printed size.
FIGURE_COLUMNS = 3


def figure_grid(panels: int) -> tuple[int, int]:
    """(columns, rows) of a figure with `panels` panels."""
    columns = min(panels, FIGURE_COLUMNS)
    return columns, -(-panels // columns)


def plot(result: dict, out: str, path: str) -> str | None:
    """Learning curves, and every seed's final metrics (dots, a seed's runs joined by a
    line across the losses: the comparison is paired) with their mean (bar)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ntl_jax.train.logging_utils import read_metrics

    labels = list(dict.fromkeys(r["loss"] for r in result["runs"]))
    shown = result["table_metrics"]
    columns, rows = figure_grid(1 + len(shown))
    fig, grid = plt.subplots(rows, columns, figsize=(4.6 * columns, 4.2 * rows + 0.4), squeeze=False)
    axes = grid.ravel()
    for ax in axes[1 + len(shown):]:
        ax.set_visible(False)
    for i, label in enumerate(labels):
        color = f"C{i}"
        curves = []
        for r in (r for r in result["runs"] if r["loss"] == label):
            recs = [m for m in read_metrics(os.path.join(out, r["run_dir"], "metrics.jsonl"))
                    if "train/cross_entropy" in m]
            curves.append(([m["step"] for m in recs], [m["train/cross_entropy"] for m in recs]))
        n = min(len(c[0]) for c in curves)
        ys = np.array([c[1][:n] for c in curves])
        axes[0].plot(curves[0][0][:n], ys.mean(0), color=color, label=label)
        if len(curves) > 1:
            axes[0].fill_between(curves[0][0][:n], ys.min(0), ys.max(0), color=color, alpha=0.15)
        for ax, metric in zip(axes[1:], shown):
            finite = [v for v in result["summary"][label][metric]["values"] if v is not None]
            if finite:
                ax.hlines(np.mean(finite), i - 0.3, i + 0.3, color="black", zorder=4)
    for ax, metric in zip(axes[1:], shown):
        for xs, ys in seed_lines(result, metric, labels).values():
            ax.plot(xs, ys, color="0.6", linewidth=0.8, zorder=2)
            ax.scatter(xs, ys, c=[f"C{i}" for i in range(len(labels))], s=18, zorder=3)
    axes[0].set(xlabel="step", ylabel="train cross-entropy (per token)", yscale="log",
                title="learning curves (mean, min-max)")
    axes[0].legend(fontsize=8)
    for ax, metric in zip(axes[1:], shown):
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=9)
        ax.set_title(metric.replace("test_", "") + "\n(a line per seed)", fontsize=10)
    fig.suptitle(result["title"], fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_only_seeds(args: argparse.Namespace) -> None:
    outside = sorted({s for s in args.only_seeds or [] if not 0 <= s < args.seeds})
    if outside:
        raise ValueError(f"--only-seeds takes seeds of 0..{args.seeds - 1} (--seeds {args.seeds}); "
                         f"got {', '.join(map(str, outside))}")


def run(args: argparse.Namespace) -> int:
    from ntl_jax.train.checkpoint import CheckpointError
    from ntl_jax.train.trainer import Diverged, Interrupted, check_output_dir, write_json

    t0 = time.perf_counter()
    if args.task in ("multiplication", "diabetes"):
        args.module = args.task
    try:
        cli_train.check_module(args.module)
        cli_train.check_gce_sigma(args, args.losses)
        check_also_against(args)
        check_primary_metric(args)
        check_only_seeds(args)
        out = check_output_dir(args.out)
        machines = read_machines(out)  # before the runs: a broken file fails here
        pretrain, runs = plan(args, out)
        for spec in pretrain + runs:
            _config(args, spec).validate()
        results = _execute(args, out, pretrain, runs)
    except (ValueError, CheckpointError) as e:
        print(f"ntl-jax compare: error: {e}", file=sys.stderr)
        return 2
    except Diverged as e:
        print(f"ntl-jax compare: error: {e} (finished runs are kept)", file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt):
        print("ntl-jax compare: interrupted; rerun the same command to resume "
              "(finished runs are reused)", file=sys.stderr)
        return 130
    if args.only_seeds is not None:
        print(f"trained seed(s) {', '.join(map(str, sorted(set(args.only_seeds))))} of {args.seeds}: "
              f"{len(results)} run(s) under {out}; the summary is written by the command "
              f"without --only-seeds, which reuses them")
        return 0
    from ntl_jax.train import results_table

    result = build_result(args, getattr(args, "_argv", None), out, pretrain, runs, results,
                          time.perf_counter() - t0, machines)
    result["earlier_seconds"] = _earlier_seconds(os.path.join(out, "compare.json"), result)
    write_json(os.path.join(out, "compare.json"), result)
    table = results_table.render(result)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(f"{table}\n")
    figure = plot(result, out, os.path.join(out, "compare.png"))
    print(f"\n{table}\n")
    print(f"results: {os.path.join(out, 'compare.json')}, table: "
          f"{os.path.join(out, 'compare.md')}, figure: "
          f"{figure or 'not drawn (matplotlib is not installed)'}")
    print(f"wall time: {result['seconds'] / 60:.1f} min")
    return 0
