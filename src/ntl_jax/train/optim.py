"""The optimizer: AdamW or Adafactor with linear warmup, then cosine or constant decay."""

from __future__ import annotations

import optax

OPTIMIZERS = ("adamw", "adafactor")
SCHEDULES = ("cosine", "constant")


def learning_rate_schedule(learning_rate: float, total_steps: int, warmup_steps: int,
                           schedule: str = "cosine") -> optax.Schedule:
    """Linear warmup from 0 to `learning_rate`, then cosine decay to 10% or constant."""
    if learning_rate <= 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"expected total_steps >= 1 and warmup_steps >= 0, got "
                         f"{total_steps} and {warmup_steps}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    warmup = min(warmup_steps, total_steps)
    if schedule == "constant":
        after = optax.constant_schedule(learning_rate)
    else:
        after = optax.cosine_decay_schedule(learning_rate, max(total_steps - warmup, 1), alpha=0.1)
    if warmup == 0:
        return after
    return optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup), after], [warmup])


def make_optimizer(name: str = "adamw", *, learning_rate: float = 1e-3, total_steps: int,
                   warmup_steps: int = 100, schedule: str = "cosine",
                   weight_decay: float = 0.01, clip_norm: float | None = 1.0
                   ) -> optax.GradientTransformation:
    """Returns the optax transformation: global-norm clipping, then AdamW or Adafactor.

    Args:
      name: "adamw" or "adafactor".
      learning_rate: peak learning rate reached after warmup.
      total_steps: length of the run (the decay horizon).
      warmup_steps: linear warmup length.
      schedule: "cosine" (to 10% of the peak) or "constant" after warmup.
      weight_decay: decoupled weight decay (AdamW) / decay rate (Adafactor).
      clip_norm: clip gradients to this global norm; None disables clipping.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if clip_norm is not None and clip_norm <= 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    lr = learning_rate_schedule(learning_rate, total_steps, warmup_steps, schedule)
    if name == "adamw":
        opt = optax.adamw(lr, b1=0.9, b2=0.98, weight_decay=weight_decay)
    else:
        opt = optax.adafactor(lr, weight_decay_rate=weight_decay or None)
    parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm is not None else []
    return optax.chain(*parts, opt)
