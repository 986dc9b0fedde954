"""`ntl-jax compare`: CE vs CE+NTL-MSE vs CE+NTL-WAS with the same budget.

Trains each loss (for each seed) with identical data, model and optimiser, then prints a
table of test metrics (mean ± std over seeds) and writes a figure of the learning
curves and final metrics. Each run lives in `<out>/<loss>/seed_<k>/`; rerunning the
command resumes unfinished runs from their checkpoints and reuses finished ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ntl_jax.train import cli_train

# The default budget: 4.6 to 7.4 minutes measured for all three runs on a shared
# 2-core CPU (see the README for the table it produced).
DEFAULTS = dict(cli_train.DEFAULTS)
LOSSES = ("ce", "ntl-mse", "ntl-was")
# (result key suffix, column title, format)
COLUMNS = (("number_accuracy", "acc", "{:.3f}"), ("mae", "MAE", "{:.3g}"), ("r2", "R²", "{:.3f}"),
           ("log_mae", "log-MAE", "{:.3f}"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="ntl_compare",
                        help="directory for the runs, table and figure (default: %(default)s)")
    parser.add_argument("--seeds", type=cli_train.positive_int, default=1,
                        help="number of seeds per loss, 0..N-1 (default: %(default)s)")
    parser.add_argument("--losses", nargs="+", choices=cli_train.LOSSES, default=list(LOSSES),
                        help="losses to compare (default: %(default)s)")
    cli_train.add_run_arguments(parser, DEFAULTS)


def summarize(results: dict[str, list[dict]], splits: list[str]) -> tuple[str, dict]:
    """A Markdown table (mean ± std over seeds) and the same numbers as a dict."""
    header = ["loss", "seeds"] + [f"{s.removeprefix('test_')[:6]}. {title}"
                                  for s in splits for _, title, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    summary: dict = {}
    for loss, runs in results.items():
        row = [loss, str(len(runs))]
        summary[loss] = {}
        for split in splits:
            for key, _, fmt in COLUMNS:
                vals = [r["eval"][f"{split}/{key}"] for r in runs
                        if f"{split}/{key}" in r["eval"]]
                vals = [v for v in vals if np.isfinite(v)]
                summary[loss][f"{split}/{key}"] = {
                    "mean": float(np.mean(vals)) if vals else None,
                    "std": float(np.std(vals)) if vals else None, "values": vals}
                if not vals:
                    row.append("n/a")
                elif len(vals) == 1:
                    row.append(fmt.format(vals[0]))
                else:
                    row.append(f"{fmt.format(np.mean(vals))} ± {fmt.format(np.std(vals))}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), summary


def plot(run_dirs: dict[str, list[str]], summary: dict, splits: list[str], path: str,
         title: str) -> None:
    """Learning curves (train CE) and final accuracy / MAE per split, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ntl_jax.train.logging_utils import read_metrics

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for loss, dirs in run_dirs.items():
        curves = []
        for d in dirs:
            recs = [r for r in read_metrics(os.path.join(d, "metrics.jsonl"))
                    if "train/cross_entropy" in r]
            curves.append(([r["step"] for r in recs], [r["train/cross_entropy"] for r in recs]))
        n = min(len(c[0]) for c in curves)
        steps = np.array(curves[0][0][:n])
        ys = np.array([c[1][:n] for c in curves])
        line, = axes[0].plot(steps, ys.mean(0), label=loss)
        if len(curves) > 1:
            axes[0].fill_between(steps, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.2)
    axes[0].set(xlabel="step", ylabel="train cross-entropy (per token)", yscale="log",
                title="learning curves")
    axes[0].legend()
    width = 0.8 / max(len(summary), 1)
    x = np.arange(len(splits))
    for panel, key, label in ((1, "number_accuracy", "accuracy"), (2, "log_mae", "log-MAE")):
        for i, (loss, metrics) in enumerate(summary.items()):
            means = [metrics[f"{s}/{key}"]["mean"] or 0.0 for s in splits]
            stds = [metrics[f"{s}/{key}"]["std"] or 0.0 for s in splits]
            axes[panel].bar(x + i * width, means, width, yerr=stds, label=loss, capsize=3)
        axes[panel].set(xticks=x + width * (len(summary) - 1) / 2,
                        xticklabels=[s.removeprefix("test_") for s in splits], ylabel=label,
                        title=f"final {label} (greedy decoding)")
        axes[panel].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from ntl_jax.train import data as data_lib
    from ntl_jax.train.checkpoint import CheckpointError
    from ntl_jax.train.trainer import check_output_dir, train

    t0 = time.perf_counter()
    try:
        cli_train.check_module(args.module)
        out = check_output_dir(args.out)
        losses = list(dict.fromkeys(args.losses))
        results: dict[str, list[dict]] = {loss: [] for loss in losses}
        run_dirs: dict[str, list[str]] = {loss: [] for loss in losses}
        for seed in range(args.seeds):
            configs = {loss: cli_train.make_config(args, loss, seed) for loss in losses}
            for c in configs.values():
                c.validate()
            # One data pool per seed, shared by every loss: the runs differ only in the loss.
            print(f"seed {seed}: generating {args.train_examples} training problems of "
                  f"{args.module} ...", flush=True)
            data = data_lib.ArithmeticData(configs[losses[0]].data)
            for loss in losses:
                run_dir = os.path.join(out, loss, f"seed_{seed}")
                result = train(configs[loss], run_dir, data=data,
                               progress=not args.no_progress,
                               tensorboard=not args.no_tensorboard)
                results[loss].append(result)
                run_dirs[loss].append(run_dir)
    except (ValueError, CheckpointError) as e:
        print(f"ntl-jax compare: error: {e}", file=sys.stderr)
        return 2
    splits = list(data.eval_sets)
    table, summary = summarize(results, splits)
    seconds = time.perf_counter() - t0
    title = (f"{args.module}, preset {args.preset}, {args.steps} steps x batch "
             f"{args.batch_size}, {args.seeds} seed(s)")
    figure = os.path.join(out, "compare.png")
    plot(run_dirs, summary, splits, figure, title)
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump({"settings": vars(args) | {"_run": None}, "summary": summary,
                   "seconds": seconds}, f, indent=2, default=str)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(f"{title}\n\n{table}\n")
    print(f"\n{title}\n\n{table}\n\nfigure: {figure}\ntable: {os.path.join(out, 'compare.md')}"
          f"\nwall time: {seconds / 60:.1f} min")
    return 0
