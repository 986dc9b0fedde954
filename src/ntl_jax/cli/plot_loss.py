"""`ntl-jax plot-loss`: CE beside number losses (by default every shipped one, as the
registry names them) over predicted digit distributions.

The paper's picture (Zausinger et al. 2025, Fig. 1): cross-entropy only asks whether the
right digit got the mass, so every wrong digit costs the same; NTL grows with how far
the predicted digits are from the target, and so does its successor DIST² (a KL
divergence to a target spread by distance); its other successor DEL (a binary
cross-entropy per digit, weighted by the digit's mass and place) weighs places, not
distances, so it too charges every wrong digit alike. Computed with the library's own losses on a
vocabulary made of the ten digits plus padding and EOS; `--losses` takes any spec
`ntl_jax.losses.parse` reads, a registered loss of your own too.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from ntl_jax.cli.flags import checked
from ntl_jax.losses import NAMES

digit_in_range = checked(int, lambda v: 0 <= v <= 9, "a digit 0-9")
probability = checked(float, lambda v: 0.1 < v < 1, "a probability in (0.1, 1)")

DEFAULT_NAME = "ntl_loss.png"
# Every shipped loss; the README's figure names its four (`--losses mse was del dist2`).
DEFAULT_LOSSES = NAMES
MARKERS = "osd^v<>pP*XhH"


def writable_formats() -> list[str]:
    """The file extensions matplotlib can save to here, sorted.

    PGF needs the TeX program named by `rcParams["pgf.texsystem"]`, so it counts only
    when that program is installed.
    """
    import shutil

    import matplotlib
    import matplotlib.figure

    formats = set(matplotlib.figure.Figure().canvas.get_supported_filetypes())
    if not shutil.which(matplotlib.rcParams["pgf.texsystem"]):
        formats.discard("pgf")
    return sorted(formats)


def output_path(text: str) -> str:
    """Resolves `--out` to the absolute path of the file to write.

    An existing directory, or a path ending in a separator, gets `DEFAULT_NAME` inside
    it; a path without an extension gets `.png`; any other extension must be a format
    matplotlib can write (`writable_formats()`).
    """
    if not text:
        raise argparse.ArgumentTypeError("expected a file or directory path, got ''")
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(path) or text.endswith(("/", os.sep)):
        return os.path.join(path, DEFAULT_NAME)
    ext = os.path.splitext(path)[1]
    if not ext:
        return path + ".png"
    formats = writable_formats()
    if ext[1:].lower() not in formats:
        raise argparse.ArgumentTypeError(
            f"expected one of {', '.join('.' + f for f in formats)}, got {ext!r} in {text!r}")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--digit", type=digit_in_range, default=4,
                        help="the target digit (default: %(default)s)")
    parser.add_argument("--confidence", type=probability, default=0.9,
                        help="mass on the predicted digit in the left panel; the rest is "
                             "spread evenly (default: %(default)s)")
    parser.add_argument("--width", type=float, default=1.0,
                        help="std of the discretised Gaussian prediction in the right "
                             "panel (default: %(default)s)")
    parser.add_argument("--out", type=output_path, default=DEFAULT_NAME,
                        help="where to write the figure; its extension picks the format "
                             "(png, pdf, svg, ...), a path without one gets .png, and an "
                             f"existing directory (or a path ending in '/') gets {DEFAULT_NAME} "
                             "inside it; missing folders are created (default: %(default)s)")
    parser.add_argument("--losses", type=number_loss_spec, nargs="+", default=list(DEFAULT_LOSSES),
                        metavar="SPEC",
                        help="the number losses drawn beside CE, as ntl_jax.losses.parse reads "
                             "them, e.g. 'was(squash_factor=3)' (default: %(default)s)")


def number_loss_spec(text: str) -> str:
    """Checks that `text` is a number loss spec (not 'none'); returns it unchanged."""
    from ntl_jax import losses

    try:
        loss = losses.parse(text)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if loss is None:
        raise argparse.ArgumentTypeError("expected a number loss, got 'none'")
    return text


def legend_name(spec: str) -> str:
    """The name a curve gets: the loss as runs show it, its name upper-cased ("NTL-WAS",
    "NTL-WAS(squash_factor=3.0)")."""
    from ntl_jax import losses

    name, paren, params = losses.parse(spec).shown.partition("(")
    return name.upper() + paren + params


def loss_curves(digit: int, distributions: np.ndarray,
                specs: tuple[str, ...] | list[str] = DEFAULT_LOSSES) -> dict[str, np.ndarray]:
    """Per-distribution CE and each number loss in `specs` for target `digit` (a one-digit
    number: DEL's place weight is the ones', 2).

    Args:
      digit: target digit 0-9.
      distributions: `[K, 10]` probabilities over the digits 0-9 (rows sum to 1).
      specs: number loss specs, as `ntl_jax.losses.parse` reads them.

    Returns:
      `{"CE": [K], legend_name(spec): [K], ...}` as numpy arrays, e.g. `"NTL-WAS"` for "was".
    """
    import jax.numpy as jnp

    import ntl_jax

    pieces = ["<pad>", "</s>"] + [str(d) for d in range(10)]
    number_tokens = ntl_jax.NumberTokens.from_pieces(pieces)
    probs = np.concatenate([np.zeros((len(distributions), 2)), distributions], axis=1)
    logits = jnp.log(jnp.asarray(np.maximum(probs, 1e-30), jnp.float32))[:, None, :]
    targets = jnp.full((len(distributions), 1), 2 + digit, jnp.int32)
    ce = [float(ntl_jax.weighted_cross_entropy(logits[i:i + 1], targets[i:i + 1])[0])
          for i in range(len(distributions))]
    curves = {"CE": np.asarray(ce)}
    for spec in specs:
        loss = ntl_jax.number_token_loss(logits, targets, number_tokens, number_loss=spec)
        curves[legend_name(spec)] = np.asarray(loss[:, 0])
    return curves


def peaked(confidence: float) -> np.ndarray:
    """`[10, 10]`: row k puts `confidence` on digit k and spreads the rest evenly."""
    d = np.full((10, 10), (1 - confidence) / 9)
    np.fill_diagonal(d, confidence)
    return d


def gaussian(centres: np.ndarray, width: float) -> np.ndarray:
    """`[K, 10]`: discretised Gaussians over the digits, one per centre."""
    d = np.exp(-0.5 * ((np.arange(10)[None, :] - centres[:, None]) / width) ** 2)
    return d / d.sum(axis=1, keepdims=True)


def run(args: argparse.Namespace) -> int:
    if not args.width > 0:
        print(f"ntl-jax plot-loss: error: --width must be > 0, got {args.width}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)  # resolved by `output_path` when parsed
    parent = os.path.dirname(out)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        print(f"ntl-jax plot-loss: error: cannot write {out}: cannot create {parent}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 2
    if not os.access(parent, os.W_OK) or os.path.isdir(out):
        print(f"ntl-jax plot-loss: error: cannot write {out}: "
              + ("it is a directory" if os.path.isdir(out) else f"{parent} is not writable"),
              file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centres = np.linspace(0, 9, 181)
    left = loss_curves(args.digit, peaked(args.confidence), args.losses)
    right = loss_curves(args.digit, gaussian(centres, args.width), args.losses)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, marker in zip(left, MARKERS * (len(left) // len(MARKERS) + 1)):
        axes[0].plot(np.arange(10), left[name], marker + "-", label=name)
        axes[1].plot(centres, right[name], "-", label=name)
    axes[0].set(xlabel="predicted digit (argmax)", ylabel="loss", xticks=range(10),
                title=f"target {args.digit}; {args.confidence:.0%} on the predicted digit")
    axes[1].set(xlabel="centre of the predicted distribution",
                title=f"target {args.digit}; Gaussian over digits, std {args.width:g}")
    for ax in axes:
        ax.axvline(args.digit, color="grey", lw=0.8, ls=":")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0
