"""Renders docs/results/*.json into the README's <!-- results:NAME --> blocks.

    python scripts/render_results.py            # rewrite the blocks in place
    python scripts/render_results.py --check    # exit 1 if a block is stale

The rendering lives in `ntl_jax.train.results_table`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ntl_jax.train import results_table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(ROOT / "README.md"),
                        help="the Markdown file with the markers (default: %(default)s)")
    parser.add_argument("--results", default=str(ROOT / "docs" / "results"),
                        help="directory of the result files (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a block differs from its rendering")
    args = parser.parse_args(argv)
    with open(args.readme, encoding="utf-8") as f:
        text = f.read()
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
