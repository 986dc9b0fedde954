"""`ntl-jax generate`: write DeepMind mathematics files offline, in the release layout."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", required=True,
                        help="root of the layout (train-easy/, ..., extrapolate/)")
    parser.add_argument("--modules", default="all",
                        help="'all', 'paper13', 'ablation', or comma-separated module "
                             "names/prefixes, e.g. 'arithmetic__,numbers__place_value'")
    parser.add_argument("--per-train-module", type=int, default=3_000,
                        help="pairs per training module, split evenly over easy/medium/hard "
                             "(the v1.0 release has 1,999,998)")
    parser.add_argument("--per-test-module", type=int, default=1_000,
                        help="pairs per interpolate/extrapolate module (the release has 10,000)")
    parser.add_argument("--regimes", default=None,
                        help="comma-separated subset of train-easy,train-medium,train-hard,"
                             "interpolate,extrapolate (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: all cores)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from ntl_jax.data import catalogue
    from ntl_jax.data import generate

    try:
        train, extra = catalogue.select_modules(args.modules)
        regimes = catalogue.REGIMES
        if args.regimes:
            regimes = tuple(r.strip() for r in args.regimes.split(",") if r.strip())
        paths = generate.write_release(
            args.output_dir, train, extra,
            per_train_module=args.per_train_module, per_test_module=args.per_test_module,
            seed=args.seed, workers=args.workers, regimes=regimes,
            overwrite=args.overwrite, progress=not args.no_progress,
        )
    except (ValueError, FileExistsError) as e:
        print(f"ntl-jax generate: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} files under {args.output_dir}")
    return 0
