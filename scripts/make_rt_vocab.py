#!/usr/bin/env python
"""Regenerates src/ntl_jax/data/vocab_assets/rt_number_tokens.txt, the Regression Transformer's number tokens.

One piece per line, `_d_p_` for every digit d in 0..9 at every decimal place p from
--max-place down to --min-place, places in decreasing order and digits in increasing
order within a place (the authors' file has the same layout, at places 12..-12). The
line order is the id order: `ntl_jax.data.rt_vocabulary` appends the pieces
after the shipped SentencePiece vocabulary's ids.

The default range, places 31..-23 (numbers of up to 32 integer digits and 23 decimals),
covers every number in the questions and answers of the DeepMind arithmetic modules
with room to spare: measured on the offline generator (2,000 pairs per module and split,
10,000-20,000 for the longest), the most integer digits are 30 (the base-2 numbers of
arithmetic__add_or_sub_in_base; 20 for add_or_sub's extrapolation set) and the most
decimals 20 (add_or_sub's extrapolation set); the ablation module add_sub_multiple has
at most 6 digits and no decimals. A number with a digit outside the range is an error
when encoding, never a silent wrong token.

    python scripts/make_rt_vocab.py [--max-place 31] [--min-place -23] [--output PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

MAX_PLACE = 31
MIN_PLACE = -23
DEFAULT_OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "ntl_jax", "data",
                              "vocab_assets", "rt_number_tokens.txt")


def pieces(max_place: int = MAX_PLACE, min_place: int = MIN_PLACE) -> list[str]:
    """`_d_p_` for p from `max_place` down to `min_place`, d = 0..9 within each place."""
    if max_place < 0 or min_place > 0:
        raise ValueError(f"expected max_place >= 0 >= min_place (place 0 holds the units), got "
                         f"{max_place} and {min_place}")
    return [f"_{d}_{p}_" for p in range(max_place, min_place - 1, -1) for d in range(10)]


def text(max_place: int = MAX_PLACE, min_place: int = MIN_PLACE) -> str:
    """The file's contents: one piece per line."""
    return "".join(piece + "\n" for piece in pieces(max_place, min_place))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-place", type=int, default=MAX_PLACE,
                        help="highest decimal place, 10^p (default: %(default)s)")
    parser.add_argument("--min-place", type=int, default=MIN_PLACE,
                        help="lowest decimal place, 10^p (default: %(default)s)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    try:
        contents = text(args.max_place, args.min_place)
    except ValueError as e:
        parser.error(str(e))
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        f.write(contents)
    print(f"wrote {os.path.normpath(args.output)}: {contents.count(chr(10))} pieces, places "
          f"{args.max_place}..{args.min_place}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
