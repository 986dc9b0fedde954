"""The `ntl_*` settings of a MaxText run, taken off its command line before MaxText reads
it (MaxText's config refuses keys it does not know), and the MaxText settings NTL cannot
be right with."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from ntl_jax._core import checks, variants

PREFIX = "ntl_"


@dataclasses.dataclass(frozen=True)
class NumberLossSettings:
    """What `ntl_*` keys set: the objective is MaxText's cross-entropy plus
    `weight` x NTL of the kind `kind` (`ntl_jax.number_token_loss`'s `ntl_kind`).

    - `weight` (`ntl_weight`): lambda, 0.3 in the paper; 0 trains on MaxText's own loss
      and still logs NTL;
    - `kind` (`ntl_kind`): "was" (the paper's default), "mse", "mae", "huber",
      "number_level", "number_level_float", "was_cdf", "del", "dist2", "smmd", or "none"
      (MaxText's loss, NTL neither computed nor logged);
    - `squash_factor` (`ntl_squash_factor`, with "was" or "smmd"), `max_number_length`
      (`ntl_max_number_length`), `smmd_mode`, `smmd_sigma`, `smmd_alpha`
      (`ntl_smmd_mode`, `ntl_smmd_sigma`, `ntl_smmd_alpha`, with "smmd"): as in
      `ntl_jax.cross_entropy_and_ntl`;
    - `digit_level`, `prefixed_numbers` (`ntl_digit_level`, `ntl_prefixed_numbers`):
      which of the tokenizer's tokens are numbers, as in `NumberTokens.from_tokenizer`.
    """

    weight: float = 0.3
    kind: str = "was"
    squash_factor: float | None = None
    max_number_length: int | None = None
    smmd_mode: str | None = None
    smmd_sigma: float | None = None
    smmd_alpha: float | None = None
    digit_level: bool = True
    prefixed_numbers: bool = False

    def __post_init__(self):
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) \
                or not math.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"expected ntl_weight to be a finite number >= 0, got {self.weight!r}")
        if self.kind != "none" and self.kind not in variants.KINDS:
            raise ValueError(f"expected ntl_kind in {variants.KINDS + ('none',)}, got {self.kind!r}")
        if self.squash_factor is not None and self.kind not in checks.SQUASHED_KINDS:
            raise ValueError(f"ntl_squash_factor applies only to ntl_kind in {checks.SQUASHED_KINDS}, "
                             f"got ntl_kind={self.kind}")
        checks.check_smmd_options(self.kind, self.smmd_mode, self.smmd_sigma, self.smmd_alpha)

    @property
    def smmd(self) -> dict:
        """SMMD's options, as `ntl_jax.ntl_from_number_logits` takes them."""
        return dict(smmd_mode=self.smmd_mode, smmd_sigma=self.smmd_sigma, smmd_alpha=self.smmd_alpha)

    @property
    def computes_ntl(self) -> bool:
        return self.kind != "none"


_PARSERS = {
    "ntl_weight": ("weight", float),
    "ntl_kind": ("kind", str),
    "ntl_squash_factor": ("squash_factor", float),
    "ntl_max_number_length": ("max_number_length", int),
    "ntl_smmd_mode": ("smmd_mode", str),
    "ntl_smmd_sigma": ("smmd_sigma", float),
    "ntl_smmd_alpha": ("smmd_alpha", float),
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
        raise ValueError(f"expected {key} to be {'an integer' if kind is int else 'a number'}, "
                         f"got {key}={text}") from None


def split_argv(argv: Sequence[str]) -> tuple[list[str], NumberLossSettings]:
    """`(maxtext_argv, settings)`: `argv` (the program, the config file, `key=value`...)
    without its `ntl_*` arguments, and the settings they make.

    Raises:
      ValueError: an `ntl_*` key that is not known, given twice, or with a bad value.
    """
    kept, values = [], {}
    for i, arg in enumerate(argv):
        key, sep, text = str(arg).partition("=")
        if i < 2 or not sep or not key.startswith(PREFIX):
            kept.append(arg)
            continue
        if key not in _PARSERS:
            raise ValueError(f"expected an ntl_* key in {sorted(_PARSERS)}, got {key!r}")
        field, value = _parse(key, text)
        if field in values:
            raise ValueError(f"{key} is given twice")
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
