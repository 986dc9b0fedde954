"""Plain PyTorch reference of NTIL, the Numerical Token Integrity Loss (Fei et al.,
"Advancing Sequential Numerical Prediction in Autoregressive Models", ACL 2025;
GitHub xfey/NTIL, ``ntil.py``, class ``NTIL`` with a tokenizer), written from a reading
of that code for our tests.  The Gumbel noise is off: the predicted digits are the
deterministic straight-through argmax (see ``_straight_through_digits``).

Inputs
------
``digit_logits``  [batch, length, 10]  raw LM-head logits of the tokens '0'..'9' (in
                  digit order) at each *target* position: row t is the prediction of
                  target t (any causal shift is the caller's, as for the original, which
                  receives already aligned, flattened ``[batch*length, vocab]`` logits).
``digit_targets`` [batch, length]  int, the digit 0..9 where the target token is one of
                  the ten digit tokens, and any negative value (-1, -100, ...) elsewhere:
                  text, '.', '-', padding and ignored labels all behave the same.

Only these two things of the full-vocabulary call matter to the original: the logits of
the ten digit tokens, and whether (and which) digit token each label is;
``digit_inputs_from_vocab`` makes them from ``[batch, length, vocab]`` logits, token-id
labels and the ids of '0'..'9'.

Per sequence (a row of the batch)
---------------------------------
A *number* is a maximal run of consecutive digit targets.  For the digit at a position
with ``k`` digits after it in its number (k = 0 for a number's last digit)::

    p       = softmax(z)                                # the 10 digit logits only
    emd     = sum_j |j - y| * p_j                       # expected digit distance
    emd_seq = mean over the sequence's digit positions of digit_exp**k * emd

For each number with digits y_1..y_n and digit logits z_1..z_n::

    d_i     = argmax digit of z_i, with the gradient of sum_j j * softmax(z_i / tau)_j
    x       = sum_i d_i * 10**(n - i)        y = sum_i y_i * 10**(n - i)
    abs     = 0 if x == y else |x - y| / (max(x, y) + 1)
    mag     = log((max(x, y) + 1) / (min(x, y) + 1))
    abs_seq, mag_seq = means over the sequence's numbers

(argmax over softmax(z / tau), the first index on ties; the forward x is exactly the
hard-decoded number, so x == y whenever all its digits are right.  At x == y both terms'
gradients vanish: the ``where`` masks abs, and max/min split their gradient in halves.
In JAX the ``where`` matters, since there d|u|/du at u = 0 is 1.)

    ntil_seq = digit_alpha * emd_seq + abs_alpha * abs_seq + mag_alpha * mag_seq

A sequence with no digit target gives 0.  The batch loss is the plain mean over all
sequences, those with no number included (``ntil_batch``); with the cross entropy it is
combined as ``ntil_combined``.

Dtypes: the original builds its constants in torch's default float32: the place values
10**i, the weights digit_exp**k, and the target number y (summed in float32); x, the
softmaxes and the EMD are in the logits' dtype.  ``constants_dtype`` (float32 by default,
as there) chooses that dtype; ``None`` uses the logits' dtype.  (The original cannot run
float64 or float16 logits: its digit-value matmul mixes them with an int64 ``arange``, and
the error is caught and the loss returned as a constant 0.  With float64 logits this
reference equals the original with that ``arange`` cast to float64.)
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = [
    "digit_inputs_from_vocab",
    "number_spans",
    "ntil_per_sequence",
    "ntil_batch",
    "ntil_combined",
]


def digit_inputs_from_vocab(
    logits: torch.Tensor, labels: torch.Tensor, digit_token_ids: Sequence[int]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """[batch, length, vocab] logits and token-id labels -> (digit_logits, digit_targets).

    ``digit_token_ids[d]`` is the id of the token 'd'.  Labels that are not one of
    these ids (text, padding, -100) become -1.
    """
    ids = torch.as_tensor(list(digit_token_ids), dtype=torch.long, device=labels.device)
    if ids.numel() != 10 or torch.unique(ids).numel() != 10:
        raise ValueError("need the ten distinct token ids of '0'..'9'")
    digit_logits = logits[..., ids]
    match = labels.unsqueeze(-1) == ids  # [batch, length, 10]
    digit_targets = torch.where(
        match.any(-1), match.long().argmax(-1), torch.full_like(labels, -1, dtype=torch.long)
    )
    return digit_logits, digit_targets


def number_spans(targets_row: Sequence[int]) -> List[Tuple[int, int]]:
    """Half-open [start, end) spans of the maximal runs of non-negative targets."""
    spans = []
    start = None
    for pos, value in enumerate(list(targets_row) + [-1]):
        if value >= 0 and start is None:
            start = pos
        elif value < 0 and start is not None:
            spans.append((start, pos))
            start = None
    return spans


def _straight_through_digits(logits: torch.Tensor, tau: float) -> torch.Tensor:
    """[n, 10] logits -> [n] digit values: forward the argmax digit, backward the
    expected digit under softmax(logits / tau).  Gumbel noise off (scale 0)."""
    soft = torch.softmax(logits / tau, dim=-1)
    hard = torch.nn.functional.one_hot(soft.argmax(dim=-1), 10).to(soft.dtype)
    # Same order of operations as the original: (hard - soft) + soft, whose forward
    # value is exactly the one-hot (round to nearest).
    one_hot = hard - soft.detach() + soft
    digit_values = torch.arange(10, dtype=soft.dtype, device=soft.device)
    return one_hot @ digit_values


def _place_values(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """10**(n-1), ..., 10, 1 as Python floats, then cast (float32 in the original)."""
    return torch.tensor([10.0 ** e for e in reversed(range(n))], dtype=dtype, device=device)


def _one_sequence(
    z: torch.Tensor,
    y: torch.Tensor,
    *,
    digit_alpha: float,
    abs_alpha: float,
    mag_alpha: float,
    digit_exp: float,
    tau: float,
    cdt: torch.dtype,
) -> torch.Tensor:
    """z: [length, 10] logits, y: [length] targets (negative = not a digit)."""
    device = z.device
    zero = torch.zeros((), dtype=cdt, device=device)
    spans = number_spans(y.tolist())
    if not spans:
        return zero

    # --- token level: place-weighted expected digit distance -----------------------
    positions, digits_after = [], []
    for start, end in spans:
        for pos in range(start, end):
            positions.append(pos)
            digits_after.append(end - 1 - pos)
    positions_t = torch.tensor(positions, dtype=torch.long, device=device)
    target_digits = y[positions_t]
    probs = torch.softmax(z[positions_t], dim=-1)  # [n_digits, 10]
    grid = torch.arange(10, dtype=cdt, device=device)
    distance = (grid.unsqueeze(0) - target_digits.to(cdt).unsqueeze(1)).abs()
    expected_distance = (distance * probs).sum(dim=-1)
    weights = torch.pow(
        torch.tensor(digit_exp, dtype=cdt, device=device),
        torch.tensor(digits_after, dtype=cdt, device=device),
    )
    emd_term = (expected_distance * weights).mean()

    # --- number level: straight-through predicted number vs target number ----------
    # The predicted number is built separately for the two terms, as in the original
    # (with its Gumbel noise on they would see different draws).  Without noise the
    # values are the same; only bfloat16 gradients round differently when it is shared.
    def numbers(start, end):
        place = _place_values(end - start, cdt, device)
        x_num = (_straight_through_digits(z[start:end], tau) * place).sum()
        y_num = (y[start:end].to(cdt) * place).sum()
        return x_num, y_num

    abs_terms, mag_terms = [], []
    for start, end in spans:
        x_num, y_num = numbers(start, end)
        rel = (x_num - y_num).abs() / (torch.maximum(x_num, y_num) + 1.0)
        abs_terms.append(torch.where(x_num == y_num, torch.zeros_like(rel), rel))
    for start, end in spans:
        x_num, y_num = numbers(start, end)
        big, small = torch.maximum(x_num, y_num), torch.minimum(x_num, y_num)
        mag_terms.append(torch.log((big + 1.0) / (small + 1.0)))
    abs_term = torch.stack(abs_terms).mean()
    mag_term = torch.stack(mag_terms).mean()

    return digit_alpha * emd_term + abs_alpha * abs_term + mag_alpha * mag_term


def ntil_per_sequence(
    digit_logits: torch.Tensor,
    digit_targets: torch.Tensor,
    *,
    digit_alpha: float = 1.0,
    abs_alpha: float = 0.2,
    mag_alpha: float = 0.2,
    digit_exp: float = 1.2,
    tau: float = 0.1,
    constants_dtype: Optional[torch.dtype] = torch.float32,
) -> torch.Tensor:
    """NTIL of each sequence, [batch]; see the module docstring.

    The result's dtype is the promotion of the logits' dtype and ``constants_dtype``
    (float32 for float32 or bfloat16 logits, float64 for float64 logits).
    """
    if digit_logits.ndim != 3 or digit_logits.shape[-1] != 10:
        raise ValueError("digit_logits must be [batch, length, 10]")
    if tuple(digit_targets.shape) != tuple(digit_logits.shape[:2]):
        raise ValueError("digit_targets must be [batch, length]")
    if digit_targets.numel() and int(digit_targets.max()) > 9:
        raise ValueError("digit targets are 0..9 (negative: not a digit)")
    cdt = digit_logits.dtype if constants_dtype is None else constants_dtype
    out_dtype = torch.promote_types(digit_logits.dtype, cdt)
    rows = [
        _one_sequence(
            digit_logits[b],
            digit_targets[b],
            digit_alpha=digit_alpha,
            abs_alpha=abs_alpha,
            mag_alpha=mag_alpha,
            digit_exp=digit_exp,
            tau=tau,
            cdt=cdt,
        ).to(out_dtype)
        for b in range(digit_logits.shape[0])
    ]
    return torch.stack(rows)


def ntil_batch(digit_logits: torch.Tensor, digit_targets: torch.Tensor, **kwargs) -> torch.Tensor:
    """The original's batch value: the mean over *all* sequences (0 for those with no
    digit target)."""
    return ntil_per_sequence(digit_logits, digit_targets, **kwargs).mean()


def ntil_combined(
    ce: torch.Tensor, ntil: torch.Tensor, lam: float = 0.3, eps: float = 1e-10
) -> torch.Tensor:
    """CE + lam * stop_gradient(CE / (NTIL + eps)) * NTIL, on batch scalars.

    The value is about (1 + lam) * CE whenever NTIL >> eps and exactly CE when NTIL is 0
    (no digit in the batch); the gradient is grad CE + lam * CE / (NTIL + eps) * grad NTIL.
    With lam == 0 the original returns CE alone (NTIL is not computed).
    """
    if lam == 0.0:
        return ce
    scale = (ce / (ntil + eps)).detach()
    return scale * lam * ntil + ce
