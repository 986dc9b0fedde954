"""The `ntl_*` settings of a MaxText run, taken off its command line before MaxText reads
it (MaxText's config refuses keys it does not know), and the MaxText settings NTL cannot
be right with."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from ntl_jax._core.number_losses import registry
from ntl_jax._core.number_losses.number_loss import DEFAULT, NumberLoss, weight_of

PREFIX = "ntl_"
NUMBER_LOSS_KEY = "ntl_number_loss"
# The key of 0.2 that named the loss (its parameters had a key each): refused, with the spec.
_OLD_KIND_KEY = PREFIX + "kind"


@dataclasses.dataclass(frozen=True)
class NumberLossSettings:
    """What `ntl_*` keys set: the objective is MaxText's cross-entropy plus
    `weight` x the number loss `number_loss`.

    - `weight` (`ntl_weight`): lambda; not given (None), the loss's own
      (`NumberLoss.default_weight`: 0.3 for NTL, the paper's); 0 trains on MaxText's own
      loss and still logs NTL. Held resolved;
    - `number_loss` (`ntl_number_loss`): the loss as `ntl_jax.cross_entropy_and_ntl`'s
      `number_loss` takes it: a spec (`"was"`, the paper's default; `"smmd(sigma=2,
      mode=smooth)"`), read by `ntl_jax.losses.parse`; from Python a `NumberLoss`, one of
      your own too; `"none"` or None: MaxText's loss, NTL neither computed nor logged.
      Held as the `NumberLoss` it names;
    - `digit_level`, `prefixed_numbers` (`ntl_digit_level`, `ntl_prefixed_numbers`):
      which of the tokenizer's tokens are numbers, as in `NumberTokens.from_tokenizer`.
    """

    weight: float | None = None
    number_loss: NumberLoss | str | None = DEFAULT
    digit_level: bool = True
    prefixed_numbers: bool = False

    def __post_init__(self):
        if self.weight is not None and (isinstance(self.weight, bool) or not isinstance(self.weight, (int, float))
                                        or not math.isfinite(self.weight) or self.weight < 0):
            raise ValueError(f"expected ntl_weight to be a finite number >= 0, got {self.weight!r}")
        try:
            number_loss = registry.resolve(self.number_loss, NUMBER_LOSS_KEY)
        except ValueError as error:
            raise ValueError(f"{NUMBER_LOSS_KEY}={self.number_loss!r}: {error}") from None
        object.__setattr__(self, "number_loss", number_loss)
        object.__setattr__(self, "weight", weight_of(number_loss, self.weight))
        for name in ("digit_level", "prefixed_numbers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"expected ntl_{name} to be true or false, got {getattr(self, name)!r}")

    @property
    def computes_ntl(self) -> bool:
        return self.number_loss is not None


_PARSERS = {
    "ntl_weight": ("weight", float),
    NUMBER_LOSS_KEY: ("number_loss", str),
    "ntl_digit_level": ("digit_level", "bool"),
    "ntl_prefixed_numbers": ("prefixed_numbers", "bool"),
}


def _parse(key: str, text: str):
    field, kind = _PARSERS[key]
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected {key}=true or {key}=false, got {key}={text}")
        return field, text.lower() == "true"
    try:
        return field, kind(text)
    except ValueError:
        raise ValueError(f"expected {key} to be a number, got {key}={text}") from None


def _old_parameter(key: str) -> tuple[str, str] | None:
    """`(loss, parameter)` for a key of 0.2 that set one loss's parameter: `ntl_<parameter>`
    or `ntl_<loss>_<parameter>`, a parameter of a shipped loss; else None."""
    word = key[len(PREFIX):]
    for name in registry.NAMES:
        if word.startswith(name + "_") and word[len(name) + 1:] in registry.parameters(name):
            return name, word[len(name) + 1:]
    for name in registry.NAMES:
        if word in registry.parameters(name):
            return name, word
    return None


def _refuse_old_keys(old: dict) -> None:
    """Raises `ValueError` naming `ntl_number_loss`, and the spec that says what the keys
    of 0.2 in `old` (`{key: text}`) said."""
    loss = old.get(_OLD_KIND_KEY)
    params = []
    for key, text in old.items():
        if key != _OLD_KIND_KEY:
            name, param = _old_parameter(key)
            loss = loss or name
            params.append(f"{param}={text}")
    spec = f"{loss}({', '.join(params)})" if params else loss
    gone = "is no longer a key" if len(old) == 1 else "are no longer keys"
    raise ValueError(f"{', '.join(old)} {gone} (ntl_jax 0.3.0): the number loss and its parameters are one "
                     f"key, {NUMBER_LOSS_KEY}, a spec that ntl_jax.losses.parse reads; here "
                     f"'{NUMBER_LOSS_KEY}={spec}'")


def split_argv(argv: Sequence[str], **settings) -> tuple[list[str], NumberLossSettings]:
    """`(maxtext_argv, settings)`: `argv` (the program, the config file, `key=value`...)
    without its `ntl_*` arguments, and the settings they make, with `settings` (fields of
    `NumberLossSettings` given from Python: `number_loss=` a `NumberLoss` of your own).

    Raises:
      ValueError: an `ntl_*` key that is not known (a key of 0.2: its spec named), given
        twice, or with a bad value.
    """
    kept, values, keys, old = [], {}, {field: key for key, (field, _) in _PARSERS.items()}, {}
    for i, arg in enumerate(argv):
        key, sep, text = str(arg).partition("=")
        if i < 2 or not sep or not key.startswith(PREFIX):
            kept.append(arg)
            continue
        if key == _OLD_KIND_KEY or (key not in _PARSERS and _old_parameter(key)):
            old[key] = text
            continue
        if key not in _PARSERS:
            raise ValueError(f"expected an ntl_* key in {sorted(_PARSERS)}, got {key!r}")
        field, value = _parse(key, text)
        if field in values:
            raise ValueError(f"{key} is given twice")
        values[field] = value
    if old:
        _refuse_old_keys(old)
    for field, value in settings.items():
        if field not in keys:
            raise TypeError(f"expected settings among the fields of NumberLossSettings {sorted(keys)}, got {field}=")
        if field in values:
            raise ValueError(f"{keys[field]} is given twice: on the command line and as {field}= from Python")
        values[field] = value
    return kept, NumberLossSettings(**values)


def check_config(config, settings: NumberLossSettings) -> None:
    """Raises `ValueError`, naming the MaxText setting, where NTL cannot be right.

    NTL is computed from the final hidden states through the output head's number-token
    columns (`loss.py`), so it refuses what would make that head differ from the one
    MaxText's cross-entropy uses, and objectives other than next-token prediction."""
    if not settings.computes_ntl:
        return
    objective = getattr(config, "training_objective", "causal_lm")
    if objective != "causal_lm":
        raise ValueError(f"expected training_objective=causal_lm for NTL (a next-token target per position), "
                         f"got training_objective={objective}")
    if getattr(config, "enable_dropout", False) and getattr(config, "dropout_rate", 0.0) > 0:
        raise ValueError(f"expected dropout_rate=0 (or enable_dropout=false) for NTL: its number-token columns "
                         f"go through the output head again and would draw a second dropout mask; "
                         f"got dropout_rate={config.dropout_rate}")
    if getattr(config, "quantization", ""):
        raise ValueError(f"expected no quantization for NTL: its number-token columns slice the output head's "
                         f"kernel, which a quantized head scales; got quantization={config.quantization}")
    if getattr(config, "use_indexer", False) and not getattr(config, "indexer_sparse_training", False):
        raise ValueError("expected indexer_sparse_training=true with use_indexer=true for NTL: the dense "
                         "warm-up trains the indexer alone and computes no logits")
