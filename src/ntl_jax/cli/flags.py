"""Argparse `type`s for the flags of the `ntl-jax` commands.

Shared by `generate`, `train`, `compare` and `plot-loss`; nothing but `argparse` is
imported, so a command's flags can be set up without loading JAX.
"""

from __future__ import annotations

import argparse

__all__ = ["checked", "finite_non_negative_float", "non_negative_int", "positive_float", "positive_int"]


def checked(convert, is_valid, expected: str):
    """An argparse `type` that converts with `convert` and rejects values failing
    `is_valid`, with a message saying what was `expected` and what came."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not is_valid(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = checked(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked(int, lambda v: v >= 0, "an integer >= 0")
positive_float = checked(float, lambda v: 0 < v < float("inf"), "a finite number > 0")
finite_non_negative_float = checked(float, lambda v: 0 <= v < float("inf"),
                                    "a finite number >= 0")
