"""Renders docs/results/*.json into docs/evidence.md's <!-- results:NAME --> blocks, and
the summary tables (<!-- summary:NAME -->: chosen rows of those tables, `SUMMARIES`) of
the README and the evidence page.

    python scripts/render_results.py                    # rewrite the blocks in place
    python scripts/render_results.py --check            # exit 1 if a block is stale
    python scripts/render_results.py --refresh-paired   # also recompute each file's "paired"
    python scripts/render_results.py --show docs/results/diabetes.json --against regression-head
                                                        # print one file's tables, every loss
                                                        # paired with another baseline

The tables' paired statistics are always computed from the per-seed numbers in a file's
"runs"; --refresh-paired writes them back into the file's "paired" section too, so a file
made before a change of statistical method agrees with its table.

The rendering lives in `ntl_jax.train.results_table`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's ntl_jax

from ntl_jax.train import results_table  # noqa: E402
from ntl_jax.train.logging_utils import write_json  # noqa: E402
from ntl_jax.train.results_table import SummaryRow as Row  # noqa: E402

EVIDENCE = ROOT / "docs" / "evidence.md"
PAGES = (EVIDENCE, ROOT / "README.md")
ACCURACY = "test_interpolate/number_accuracy"
RMSE = "test_interpolate/rmse"
LOG_MAE = "test_interpolate/log_mae"
# The evidence page's headings the summaries link to.
FINE_TUNING = "2-arithmetic-pretrain-with-ce-then-fine-tune-with-each-loss"
SYSTEMS = "4-every-system-of-the-paper-on-arithmetic__add_sub_multiple"
WHICH_LOSS = "6-which-number-loss-ntl-was-against-its-successors-and-gce"
FLOOR = "past-the-floor-multiplication-at-16000-steps-every-number-loss"
PLATEAU = "past-the-plateau-add_or_sub-at-8000-steps-every-number-loss"
DIABETES = "step-2s-diabetes-setting-every-number-loss-at-800-steps"
_BY_FLOOR = "[16,000 steps, 16 seeds](#past-the-floor-multiplication-at-16000-steps-every-number-loss)"
_BY_PLATEAU = "[8,000 steps, 12 seeds](#past-the-plateau-add_or_sub-at-8000-steps-every-number-loss)"
_BY_DIABETES = "[16 seeds, a family of 9](#step-2s-diabetes-setting-every-number-loss-at-800-steps)"


def _each(setting, anchor, name, comparisons, metric, note=None):
    return [Row(setting, anchor, name, comparison, metric, note) for comparison in comparisons]


# The README's summary: the latest setting of each question. The settings a later run
# replaced are on the evidence page ("superseded"), each with the run that replaced it.
SUMMARIES = {
    "current": ([
        Row("fine-tuning a CE model", FINE_TUNING, "finetune_add_or_sub", "ntl-was λ=0.3 lr=0.001 − ce lr=0.001",
            ACCURACY),
        Row("the paper's systems", SYSTEMS, "ablation_add_sub_multiple", "ntl-was − ce", ACCURACY),
        *_each("multiplication, 16,000 steps", FLOOR, "multiplication_past_the_floor",
               ("ntl-was − ce", "smmd − ce", "del − ntl-was", "smmd − ntl-was"), ACCURACY),
        *_each("add_or_sub, 8,000 steps", PLATEAU, "add_or_sub_past_the_plateau",
               ("ntl-was − ce", "smmd − ce", "del − ntl-was", "smmd − ntl-was"), ACCURACY),
        *_each("diabetes, 800 steps, 16 seeds", DIABETES, "diabetes_every_loss",
               ("ntl-mse − ce", "smmd − ce", "del − ntl-mse", "smmd − ntl-mse"), RMSE),
        Row("diabetes, the regression head", WHICH_LOSS, "diabetes_losses", "regression-head − ntl-mse", RMSE),
    ], None),
    "superseded": ([
        Row("arithmetic from scratch, 2,000 steps", "1-arithmetic-from-scratch", "scratch_add_or_sub",
            "ntl-was − ce", ACCURACY, _BY_PLATEAU),
        Row("multiplication, ntl-jax 0.1.0", "3-multiplication-with-a-decoder-only-model", "multiplication",
            "ntl-was − ce", ACCURACY, "today's code at 2,000 steps (below), then " + _BY_FLOOR),
        Row("multiplication, ntl-jax 0.1.0", "3-multiplication-with-a-decoder-only-model", "multiplication",
            "ntl-was − ce", "test_extrapolate/number_accuracy", _BY_FLOOR),
        Row("diabetes regression, 10 seeds", "5-regression-on-real-data-ntl-against-a-regression-head-diabetes",
            "diabetes", "ntl-mse − ce", RMSE, _BY_DIABETES),
        *_each("multiplication, 2,000 steps", WHICH_LOSS, "multiplication_losses",
               ("ntl-was − ce", "del − ntl-was", "dist2 − ntl-was"), ACCURACY, _BY_FLOOR),
        Row("multiplication, 2,000 steps", WHICH_LOSS, "multiplication_losses", "gce − ce", LOG_MAE, _BY_FLOOR),
        Row("multiplication, 2,000 steps, swept settings", "multiplication-at-the-swept-settings",
            "multiplication_picked", "ntl-was λ=0.1 − ce", ACCURACY, _BY_FLOOR),
        Row("multiplication, 2,000 steps, swept settings", "multiplication-at-the-swept-settings",
            "multiplication_picked", "gce σ=0.5 − ce", LOG_MAE, _BY_FLOOR),
        *_each("diabetes, 10 seeds, a family of 28", WHICH_LOSS, "diabetes_losses",
               ("ntl-mse − ce", "del − ntl-mse", "dist2 − ntl-mse"), RMSE, _BY_DIABETES),
    ], "superseded by"),
}


def evidence_link(page: pathlib.Path) -> str:
    """The evidence page's path from `page` ("" on the evidence page itself)."""
    page, evidence = page.resolve(), EVIDENCE.resolve()
    return "" if page == evidence else os.path.relpath(evidence, page.parent)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="append", metavar="PAGE",
                        help="a Markdown page with the markers, several by repeating it (default: "
                             + " and ".join(str(p.relative_to(ROOT)) for p in PAGES) + ")")
    parser.add_argument("--results", default=str(ROOT / "docs" / "results"),
                        help="directory of the result files (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a block differs from its rendering")
    parser.add_argument("--refresh-paired", action="store_true",
                        help="recompute the \"paired\" section of every result file from its runs")
    parser.add_argument("--show", metavar="FILE",
                        help="print the tables of one result file instead of writing the page")
    parser.add_argument("--against", metavar="LOSS",
                        help="with --show: pair every loss with LOSS's run of its seed, not the "
                             "file's baseline")
    args = parser.parse_args(argv)
    if args.against and not args.show:
        parser.error("--against applies to --show: expected --show FILE with it")
    if args.show:
        try:
            result = results_table.load(args.show)
            if args.against:
                result = results_table.against(result, args.against)
            print(results_table.render(result))
        except (OSError, ValueError, results_table.ResultsError) as e:
            print(f"render_results: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.check and args.refresh_paired:
        parser.error("--check writes nothing: expected one of --check, --refresh-paired, got both")
    pages = [pathlib.Path(p) for p in args.readme] if args.readme else list(PAGES)
    texts = {}
    for page in pages:
        try:
            texts[page] = page.read_text(encoding="utf-8")
        except OSError as e:
            print(f"render_results: error: cannot read {page}: {e}", file=sys.stderr)
            return 2
    if args.refresh_paired:
        for path in sorted(pathlib.Path(args.results).glob("*.json")):
            result = results_table.load(str(path))
            refreshed = results_table.refresh_paired(result)
            if refreshed != result:
                write_json(str(path), refreshed)
                print(f"{path}: recomputed \"paired\" from its runs")
    stale_pages = 0
    for page, text in texts.items():
        link = evidence_link(page)
        try:
            if args.check:
                stale = results_table.stale_blocks(text, args.results) + [
                    f"summary:{name}" for name in results_table.stale_summaries(
                        text, SUMMARIES, args.results, evidence=link)]
                if stale:
                    print(f"{page}: stale results block(s): {', '.join(stale)}; "
                          "run python scripts/render_results.py", file=sys.stderr)
                    stale_pages += 1
                continue
            new = results_table.update_readme(text, args.results)
            new = results_table.update_summaries(new, SUMMARIES, args.results, evidence=link)
        except results_table.ResultsError as e:
            print(f"render_results: error: {page}: {e}", file=sys.stderr)
            return 2
        if new != text:
            page.write_text(new, encoding="utf-8")
    return 1 if stale_pages else 0

if __name__ == "__main__":
    sys.exit(main())
