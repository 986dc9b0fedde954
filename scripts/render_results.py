"""Renders docs/results/*.json into docs/evidence.md's <!-- results:NAME --> blocks.

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
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ntl_jax.train import results_table  # noqa: E402
from ntl_jax.train.logging_utils import write_json  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(ROOT / "docs" / "evidence.md"),
                        help="the Markdown file with the markers (default: %(default)s)")
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
    try:
        with open(args.readme, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"render_results: error: cannot read {args.readme}: {e}", file=sys.stderr)
        return 2
    if args.refresh_paired:
        for path in sorted(pathlib.Path(args.results).glob("*.json")):
            result = results_table.load(str(path))
            refreshed = results_table.refresh_paired(result)
            if refreshed != result:
                write_json(str(path), refreshed)
                print(f"{path}: recomputed \"paired\" from its runs")
    try:
        if args.check:
            stale = results_table.stale_blocks(text, args.results)
            if stale:
                print(f"{args.readme}: stale results block(s): {', '.join(stale)}; "
                      "run python scripts/render_results.py", file=sys.stderr)
                return 1
            return 0
        new = results_table.update_readme(text, args.results)
    except results_table.ResultsError as e:
        print(f"render_results: error: {e}", file=sys.stderr)
        return 2
    if new != text:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
