"""The checks of a number loss's parameters: each says which loss, which parameter, what
it expected and what came. A leaf, so that the losses and `NumberTokens`' tables share them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_bool(loss: str, param: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"number loss {loss!r}: expected {param} True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def check_number(loss: str, param: str, value, *, low: float, low_inclusive: bool = True) -> float:
    """`value` as a Python float; raises unless it is a finite Python number above `low`
    (a constant of the program: the losses build their tables on the host)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"number loss {loss!r}: expected {param} to be a Python number, "
                        f"got {type(value).__name__} {value!r}")
    bound = f"{'>=' if low_inclusive else '>'} {low:g}"
    if not math.isfinite(value) or value < low or (value == low and not low_inclusive):
        raise ValueError(f"number loss {loss!r}: expected {param} finite and {bound}, got {value!r}")
    return float(value)


def check_int(loss: str, param: str, value, *, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"number loss {loss!r}: expected {param} to be an integer >= {low}, got {value!r}")
    return int(value)


def check_choice(loss: str, param: str, value, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"number loss {loss!r}: expected {param} in {choices}, got {value!r}")
    return value
