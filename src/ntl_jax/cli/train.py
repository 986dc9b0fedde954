"""`ntl-jax train`: train a small T5 on a mathematics module with or without NTL."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

from ntl_jax.cli import REFUSED
from ntl_jax.cli import flags as cli_flags
from ntl_jax.cli.flags import finite_non_negative_float, non_negative_int, positive_float, positive_int
from ntl_jax.losses import DEFAULT_WEIGHT, MEAN_OVERS, NAMES, parse
from ntl_jax.train import loss_names, systems
from ntl_jax.train.data import EVAL_CHOICES
from ntl_jax.train.loss_names import GCE_PREFIX

# Defaults shared with `ntl-jax compare` (its defaults are this run at three losses).
# arithmetic__add_or_sub rather than the paper's add_sub_multiple ablation module: at
# this CPU budget the tiny model learns the former (about 40% exact answers) while on
# the latter it predicts one constant answer for every question.
DEFAULTS = dict(preset="tiny", module="arithmetic__add_or_sub", steps=2000,
                batch_size=32, learning_rate=3e-3, warmup_steps=100,
                train_examples=20_000, eval_examples=500)
# "ce" and the trainer's name of every number loss of `ntl_jax.losses` ("ntl-<variant>"; "del",
# "dist2" and "smmd" for NTL's successors), and the same on the Gaussian-smoothed cross-entropy,
# "gce" and "gce+<loss>" (`ntl_jax.train.loss_names`); each number loss also takes its
# parameters in parentheses, as in its spec: "smmd(mode=mmd)".
NUMBER_LOSSES = tuple(parse(name).shown for name in NAMES)
LOSSES = ("ce", "gce") + NUMBER_LOSSES + tuple("gce+" + loss for loss in NUMBER_LOSSES)
# The `--loss` names: LOSSES (the token-head losses, `ntl_jax.train.step`) and the paper's
# baselines (`ntl_jax.train.systems`).
CHOICES = LOSSES + systems.BASELINES
# Flags 0.3.0 removed, by the number loss whose weight they held: `--ntl-weight LOSS=LAMBDA`.
REMOVED_WEIGHT_FLAGS = {"--del-weight": "del", "--dist2-weight": "dist2", "--smmd-weight": "smmd"}
PRESETS = ("micro", "tiny", "small", "base")
ARCHITECTURES = ("encoder-decoder", "decoder-only")


def architecture(args: argparse.Namespace) -> str:
    """`--architecture`, or the task's default network."""
    if args.architecture:
        return args.architecture
    return "decoder-only" if args.module == "multiplication" else "encoder-decoder"


def system(text: str) -> str:
    """An argparse `type`: a system name (`CHOICES`, a number loss with its parameters in
    parentheses), as runs record it (`systems.canonical`)."""
    try:
        return systems.canonical(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Weight:
    """One `--ntl-weight` value: λ for `loss` only, or (`loss` None) for every loss."""

    value: float
    loss: str | None = None

    def __str__(self) -> str:  # as it is written on the command line and recorded
        return f"{self.loss}={self.value!r}" if self.loss else repr(self.value)


def weight(text: str) -> Weight:
    """An argparse `type`: `LAMBDA` or `LOSS=LAMBDA` (a system name as `system` reads it)."""
    loss, equals, value = text.rpartition("=")
    if not equals:
        return Weight(finite_non_negative_float(text.strip()))
    try:
        value = finite_non_negative_float(value.strip())
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected LAMBDA or LOSS=LAMBDA, LAMBDA a finite number >= 0, got "
                                         f"{text!r}") from None
    try:
        return Weight(value, systems.canonical(loss.strip()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected LAMBDA or LOSS=LAMBDA, got {text!r}: {e}") from None


class _RemovedWeightFlag(argparse.Action):
    """A weight flag 0.3.0 removed: refused with the `--ntl-weight` that replaces it. The
    refusal (`REFUSED`, read once all flags are parsed: `ntl_jax.cli`) names every such
    flag of the command line at once, so one message gives the whole new form."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, argparse.SUPPRESS, nargs="*", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        loss = REMOVED_WEIGHT_FLAGS[self.option_strings[0]]
        given = [f"{loss}={value}" for value in values] or [f"{loss}=LAMBDA"]
        flags, weights = getattr(namespace, "_removed_weight_flags", ([], []))
        flags, weights = flags + [option_string], weights + given
        setattr(namespace, "_removed_weight_flags", (flags, weights))
        setattr(namespace, REFUSED, f"{', '.join(flags)} {'was' if len(flags) == 1 else 'were'} removed in "
                                    f"ntl-jax 0.3.0: each loss's weight is --ntl-weight [LOSS=]LAMBDA; use "
                                    f"--ntl-weight {' '.join(weights)}")


def weight_of(args: argparse.Namespace, loss: str) -> float:
    """`train`'s `--ntl-weight` for `loss`, or the loss's default (`systems.default_weight`).
    `LOSS=LAMBDA` names `loss`, or for "gce+<loss>" also "<loss>", as `compare` reads it.

    Raises:
      ValueError: `--ntl-weight LOSS=LAMBDA` names another loss than `loss`.
    """
    given = getattr(args, "ntl_weight", None)
    if not isinstance(given, Weight):  # compare's list: per run, in overrides
        return systems.default_weight(loss)
    if given.loss is not None and given.loss not in (loss, loss.removeprefix(GCE_PREFIX)):
        raise ValueError(f"--ntl-weight expected LAMBDA or {loss}=LAMBDA (the loss trained), got {given}")
    return given.value


def add_run_arguments(parser: argparse.ArgumentParser, defaults: dict,
                      sweep: bool = False) -> None:
    """Flags shared by `train` and `compare` (model, data, optimisation, logging);
    with `sweep`, the weights and `--gce-sigma` take several values."""
    g = parser.add_argument_group("model and data")
    g.add_argument("--preset", choices=PRESETS, default=defaults["preset"],
                   help="network size (default: %(default)s)")
    g.add_argument("--architecture", choices=ARCHITECTURES, default=None,
                   help="network (default: decoder-only for --module multiplication, "
                        "encoder-decoder otherwise)")
    g.add_argument("--module", default=defaults["module"],
                   help="DeepMind mathematics module, or 'multiplication' (k-digit x l-digit "
                        "products) (default: %(default)s)")
    g.add_argument("--train-examples", type=positive_int, default=defaults["train_examples"],
                   help="size of the generated training pool (default: %(default)s)")
    g.add_argument("--eval-examples", type=positive_int, default=defaults["eval_examples"],
                   help="problems per test split (default: %(default)s)")
    g = parser.add_argument_group("optimisation")
    g.add_argument("--steps", type=positive_int, default=defaults["steps"],
                   help="training steps (default: %(default)s)")
    g.add_argument("--batch-size", type=positive_int, default=defaults["batch_size"],
                   help="(default: %(default)s)")
    g.add_argument("--optimizer", choices=("adamw", "adafactor"), default="adamw",
                   help="(default: %(default)s)")
    g.add_argument("--learning-rate", type=positive_float, default=defaults["learning_rate"],
                   help="peak learning rate (default: %(default)s)")
    g.add_argument("--warmup-steps", type=non_negative_int, default=defaults["warmup_steps"],
                   help="(default: %(default)s)")
    g.add_argument("--ntl-weight", type=weight, default=None, nargs="+" if sweep else None,
                   action="extend" if sweep else "store", metavar="[LOSS=]LAMBDA",
                   help="lambda in CE + lambda * the number loss; LOSS=LAMBDA for the loss LOSS only"
                        + (", LAMBDA for every loss not named so; several (or the flag again) to sweep"
                           if sweep else "")
                        + " (default: each loss's own: "
                        + ", ".join(f"{loss.shown} {loss.default_weight:g}" for loss in map(parse, NAMES)
                                    if loss.default_weight != DEFAULT_WEIGHT)
                        + f", {DEFAULT_WEIGHT:g} for the others)")
    g.add_argument("--ntl-mean-over", choices=MEAN_OVERS, default=None,
                   help="how each number loss's term is normalised: counted, its mean over the positions it "
                        "counts beside CE's mean over the tokens (each shipped loss's, its authors'); targets, "
                        "its sum divided by all the target tokens, as ntl_jax 0.4 and before did (the paper's "
                        "term x the share of number targets; the comparisons kept under evidence/ ran so) "
                        "(default: each loss's own)")
    for flag in REMOVED_WEIGHT_FLAGS:
        g.add_argument(flag, action=_RemovedWeightFlag)
    g.add_argument("--eval-split", choices=EVAL_CHOICES, default="test",
                   help="test: score on the task's test splits; validation: on held-out "
                        "problems drawn like the training ones (none of the run's training "
                        "pool), to pick settings without looking at the tests (default: "
                        "%(default)s)")
    g.add_argument("--dropout-rate", default=0.0, metavar="RATE",
                   type=cli_flags.checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)"),
                   help="dropout in the network (T5's fine-tuning uses 0.1; useful on small data "
                        "such as --module diabetes) (default: %(default)s)")
    g.add_argument("--gce-sigma", type=positive_float, default=None, metavar="SIGMA",
                   nargs="+" if sweep else None,
                   help="width of the Gaussian label of the gce losses (gce, gce+ntl-*): at a number "
                        "target y, q_j ~ exp(-(v_j - y)^2 / (2 SIGMA^2)) over the number tokens"
                        + (", several to sweep it" if sweep else "") + " (default: 1.0, the authors')")
    g.add_argument("--rt-float-encodings", action=argparse.BooleanOptionalAction, default=True,
                   help="rt, rt+ntl-mse: add the authors' fixed float encodings (each RT token's value, "
                        "log-scaled) to the input embeddings of the RT number tokens, in the encoder "
                        "and the decoder, as their RT does (default: %(default)s)")
    g.add_argument("--fused-loss", action=argparse.BooleanOptionalAction, default=True,
                   help="compute the loss from the decoder's hidden states without forming the "
                        "[batch, length, vocab] logits (ntl_jax.fused_cross_entropy_and_ntl; the "
                        "same loss to float32 rounding; faster and smaller on every shape measured, "
                        "see benchmarks/) (default: %(default)s)")
    g = parser.add_argument_group("logging and checkpoints")
    g.add_argument("--log-every", type=positive_int, default=50,
                   help="log training metrics every N steps (default: %(default)s)")
    g.add_argument("--checkpoint-every", type=positive_int, default=500,
                   help="a multiple of --log-every (default: %(default)s)")
    g.add_argument("--eval-every", type=non_negative_int, default=0,
                   help="evaluate every N steps; 0: at the end only (default)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard files")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loss", type=system, default=loss_names.DEFAULT, metavar="LOSS",
                        help="ce: cross-entropy only; a number loss of ntl_jax.losses, "
                             f"{', '.join(NUMBER_LOSSES)}: CE + lambda * it, its parameters in parentheses as in "
                             "its spec (ntl_jax.losses.parse), e.g. 'smmd(mode=mmd)'; a loss of your own as "
                             "'module:name(...)', the module that holds or registers it (importable here: on "
                             "PYTHONPATH or installed), or by its name where a package names it as an entry point; "
                             "gce, gce+<number loss>: the "
                             "same with the Gaussian-smoothed cross-entropy (--gce-sigma); "
                             "regression-head: the encoder's mean-pooled output -> a linear layer, "
                             "MSE on sign(x) log1p(|x|) of the answer x (a baseline); "
                             "rt, rt+ntl-mse: the Regression Transformer's number tokens (each digit "
                             "one token with its decimal place, _d_p_) trained with CE, and with CE + "
                             "lambda * NTL-MSE on the digits (baselines); "
                             "xval: each number one [NUM] token whose embedding is scaled by the "
                             "log-scaled value, a number head predicting it, (CE + MSE) / 2 (a "
                             "baseline) (default: %(default)s)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="initialisation, dropout and data order (default: 0)")
    parser.add_argument("--out", required=True,
                        help="run directory; rerunning the same command resumes from it")
    parser.add_argument("--init-from", metavar="RUN_DIR", default="",
                        help="start from the final parameters of the finished run in RUN_DIR "
                             "(same network and vocabulary; fresh optimizer state and this "
                             "run's own schedule), e.g. to fine-tune a CE-pretrained model")
    add_run_arguments(parser, DEFAULTS)


def make_config(args: argparse.Namespace, loss: str, seed: int, **overrides):
    """The `TrainConfig` described by parsed flags (and `overrides` of its fields)."""
    from ntl_jax.train.data import DataConfig
    from ntl_jax.train.trainer import TrainConfig

    arch = architecture(args)
    data = DataConfig(module=args.module, train_examples=args.train_examples,
                      eval_examples=args.eval_examples, batch_size=args.batch_size, seed=seed,
                      architecture=arch, eval_split=getattr(args, "eval_split", "test"))
    fields = dict(loss=loss, preset=args.preset, architecture=arch, steps=args.steps,
                  seed=seed, optimizer=args.optimizer, learning_rate=args.learning_rate,
                  warmup_steps=args.warmup_steps, ntl_weight=weight_of(args, loss),
                  ntl_mean_over=getattr(args, "ntl_mean_over", None),
                  dropout_rate=getattr(args, "dropout_rate", 0.0),
                  fused_loss=args.fused_loss, rt_float_encodings=getattr(args, "rt_float_encodings", True),
                  data=data,
                  log_every=args.log_every, checkpoint_every=args.checkpoint_every,
                  eval_every=args.eval_every)
    if getattr(args, "init_from", ""):
        fields["init_from"] = os.path.abspath(args.init_from)
    if isinstance(getattr(args, "gce_sigma", None), float):  # compare's list: per run, in overrides
        fields["gce_sigma"] = args.gce_sigma
    return TrainConfig(**(fields | overrides))


def check_gce_sigma(args: argparse.Namespace, losses) -> None:
    """Raises ValueError if `--gce-sigma` is given but none of `losses` uses it."""
    from ntl_jax.train.step import uses_gce

    if getattr(args, "gce_sigma", None) is not None and not any(uses_gce(loss) for loss in losses):
        raise ValueError(f"--gce-sigma applies to the gce losses (gce, gce+ntl-<variant>), got "
                         f"{', '.join(losses)}")


def check_module(module: str) -> None:
    from ntl_jax.train import data as data_lib

    data_lib.check_task(module)


def format_metrics(metrics: dict) -> str:
    """`name  value` lines; a metric that could not be computed (None, NaN) is "n/a"."""
    width = max((len(k) for k in metrics), default=0)
    lines = []
    for key, value in sorted(metrics.items()):
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        lines.append(f"  {key:<{width}}  {f'{value:.4g}' if ok else 'n/a'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ntl_jax.train.checkpoint import CheckpointError
    from ntl_jax.train.trainer import Diverged, Interrupted, check_output_dir, train

    try:
        check_module(args.module)
        check_gce_sigma(args, [args.loss])
        out = check_output_dir(args.out)
        config = make_config(args, args.loss, args.seed)
        config.validate()
        result = train(config, out, progress=not args.no_progress,
                       tensorboard=not args.no_tensorboard)
    except (ValueError, CheckpointError) as e:
        print(f"ntl-jax train: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"ntl-jax train: {e} (checkpoint {e.checkpoint})", file=sys.stderr)
        return 130
    except Diverged as e:
        print(f"ntl-jax train: error: {e}", file=sys.stderr)
        return 1
    print(f"step {result['step']}, evaluation:\n{format_metrics(result.get('eval', {}))}")
    tensorboard = os.path.join(out, "tensorboard")
    tensorboard = f"TensorBoard: {tensorboard}, " if os.path.isdir(tensorboard) else ""
    print(f"metrics: {out}/metrics.jsonl, {tensorboard}results: {out}/results.json")
    return 0
