"""The `ntl-jax` command.

Each subcommand lives in its own module, which exposes `add_arguments(parser)` and
`run(args) -> int`. Modules are imported only when their subcommand is chosen, so
`ntl-jax --help` stays fast and needs none of the optional dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "generate": ("ntl_jax.data.generate_cli", "write DeepMind mathematics files offline"),
    "train": ("ntl_jax.train.cli_train", "train a small T5 with or without NTL"),
    "compare": ("ntl_jax.train.cli_compare", "train CE, CE+NTL-MSE and CE+NTL-WAS and compare"),
    "plot-loss": ("ntl_jax.train.cli_plot_loss", "plot CE, NTL-MSE and NTL-WAS over digit distributions"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ntl-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported to configure its flags.
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
