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
    "generate": ("ntl_jax.cli.generate", "write DeepMind mathematics files offline"),
    "train": ("ntl_jax.cli.train", "train a small T5 with or without NTL"),
    "compare": ("ntl_jax.cli.compare", "paired runs of CE and CE+NTL over seeds, with intervals"),
    "plot-loss": ("ntl_jax.cli.plot_loss", "plot CE and the number losses over digit distributions"),
}

DESCRIPTION = """\
Number Token Loss (NTL) for JAX: generate DeepMind mathematics data offline, train a
small T5 with cross-entropy with or without NTL, compare the losses, and plot them."""

EPILOG = """\
examples:
  ntl-jax compare --out runs/compare      CE vs CE+NTL-WAS over seeds: paired table, figure
  ntl-jax plot-loss --out ntl_loss.png    the loss curves for one target digit

Run `ntl-jax COMMAND --help` for the options of a command."""

# A namespace attribute: a flag's action that refuses the flag sets it to the message,
# which the command's parser gives once every flag is read (so that it names them all).
REFUSED = "_refused"


def version() -> str:
    """The installed distribution's version, or the package's when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("ntl-jax")
    except metadata.PackageNotFoundError:
        from ntl_jax import __version__

        return __version__


class _Parser(argparse.ArgumentParser):
    """Gives the refusal the flags' actions left (`REFUSED`) as its error."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        refused = getattr(namespace, REFUSED, None)
        if refused:
            self.error(refused)
        return namespace, extras


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps each command and its help on one line: Python < 3.13 leaves the
    commands' extra indentation out when it aligns the help column."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and hasattr(action, "_get_subactions"):
            for sub in action._get_subactions():
                width = len(self._format_action_invocation(sub))
                self._action_max_length = max(self._action_max_length, width
                                              + self._current_indent + self._indent_increment)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="ntl-jax", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
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
    if args.command is None:
        # No command: the full help, which lists the commands, rather than a bare usage error.
        parser.print_help(sys.stderr)
        return 2
    args._argv = argv  # recorded with results, so a result names its command
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"ntl-jax {args.command}: interrupted; rerun the same command to resume "
              f"(finished runs and checkpoints are kept)", file=sys.stderr)
        return 130

