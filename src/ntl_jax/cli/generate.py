"""`ntl-jax generate`: write DeepMind mathematics files offline, in the release layout."""

from __future__ import annotations

import argparse
import os
import sys

from ntl_jax.cli.flags import checked, positive_int

# Split evenly over easy/medium/hard (rounded down), so fewer than 3 would write nothing.
per_train_count = checked(int, lambda v: v >= 3,
                          "an integer >= 3 (it is split over the three train difficulties)")


def output_dir(text: str) -> str:
    """An argparse `type`: a directory that exists or can be created, and is writable."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory path, got ''")
    path = os.path.abspath(os.path.expanduser(text))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is a file" if existing == path else f"is under a file, {existing}"
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r}, which {what}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"expected a writable directory, got {text!r} "
                                         f"({existing} is not writable)")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", required=True, type=output_dir,
                        help="root of the layout (train-easy/, ..., extrapolate/); created "
                             "if missing")
    parser.add_argument("--modules", default="all",
                        help="'all', 'paper13', 'ablation', or comma-separated module "
                             "names/prefixes, e.g. 'arithmetic__,numbers__place_value' "
                             "(default: %(default)s)")
    parser.add_argument("--per-train-module", type=per_train_count, default=3_000,
                        help="pairs per training module, split evenly over easy/medium/hard "
                             "and rounded down to a multiple of 3 (the v1.0 release has "
                             "1,999,998; default: %(default)s)")
    parser.add_argument("--per-test-module", type=positive_int, default=1_000,
                        help="pairs per interpolate/extrapolate module (the release has "
                             "10,000; default: %(default)s)")
    parser.add_argument("--regimes", default=None,
                        help="comma-separated subset of train-easy,train-medium,train-hard,"
                             "interpolate,extrapolate (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (default: 0)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="worker processes (default: all cores)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from ntl_jax.data import catalogue, generate

    def error(message: str) -> int:
        print(f"ntl-jax generate: error: {message}", file=sys.stderr)
        return 2

    try:
        train, extra = catalogue.select_modules(args.modules)
        if not train and not extra:
            return error("--modules: expected 'all', 'paper13', 'ablation' or module "
                         f"names/prefixes, got {args.modules!r}")
        regimes = catalogue.REGIMES
        if args.regimes is not None:
            regimes = tuple(r.strip() for r in args.regimes.split(",") if r.strip())
            unknown = [r for r in regimes if r not in catalogue.REGIMES]
            if not regimes or unknown:
                return error(f"--regimes: expected a comma-separated subset of "
                             f"{','.join(catalogue.REGIMES)}, got {args.regimes!r}")
        paths = generate.write_release(
            args.output_dir, train, extra,
            per_train_module=args.per_train_module, per_test_module=args.per_test_module,
            seed=args.seed, workers=args.workers, regimes=regimes,
            overwrite=args.overwrite, progress=not args.no_progress,
        )
    except generate.ExistingFilesError as e:
        return error(f"{len(e.paths)} file(s) already exist, e.g. {e.paths[0]}; pass "
                     "--overwrite to replace them")
    except ValueError as e:
        return error(str(e))
    except OSError as e:
        return error(f"cannot write under {args.output_dir}: {e}")
    if not paths:
        return error("nothing to write: the selected modules have no files in regimes "
                     f"{','.join(regimes)}")
    print(f"wrote {len(paths)} files under {args.output_dir}")
    return 0
