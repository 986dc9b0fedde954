"""Plain-numpy (float64) references of NTL's successors, written from their papers and
the DEL authors' code, not from ours (tests/test_variants.py holds ours against them):

* DEL  - Digit Entropy Loss (Zheng et al., arXiv 2605.20369; GitHub PolyU-VCLab/DEL,
         train-qwen-deepseek.py, functions ``DEL`` and ``generate_place``).
* DIST2 - DIST^2 loss (Chung et al., arXiv 2503.02379, ICLR 2026), KL(p_d || p_theta).
* SMMD - Smooth MMD (arXiv 2606.27731, ICML 2026; GitHub Zuozhuo/smmd-loss, ``smmd/``:
         ``build_integer_vnum_from_tokenizer``, ``build_kernel_matrix``,
         ``squash_distances``, ``SMMDLoss.forward``).

Conventions
-----------
All inputs are converted to float64.  Positions are *target* positions (what their
code calls ``shift_labels``): the logits at position t predict the token whose
string / digit value is given for position t.

DEL per target-digit position (10 digit logits z = raw LM-head logits of the tokens
'0'..'9', in that order; y = target digit; w = place weight)::

    p      = softmax(z)                       # over the 10 digit logits only
    bce_k  = softplus(-z_k) if k == y else softplus(z_k)   # BCE_with_logits(z_k, 1[k==y])
    loss   = w * sum_k p_k * bce_k            # gradients flow through p too (no detach)

Their batch reduction (not needed per position, provided as ``del_batch_reduction``)::

    L_DEL = 0.01 * mean over (N_digit_positions x 10) of w_i * p_ik * bce_ik
          = 0.001 * (1/N_digit_positions) * sum_i loss_i

DIST2 per target position (N number-token logits, values v_j, target value y)::

    p_d(j)     = softmax_j( -(v_j - y)^2 / tau )
    log q(j)   = log_softmax_j(logits)         # over the N number tokens only
    loss       = KL(p_d || q) = sum_j p_d(j) * (log p_d(j) - log q(j))
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

DIGITS = "0123456789"


# --------------------------------------------------------------------------- helpers
def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), numerically stable, float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.logaddexp(0.0, x)


def _log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    s = x - m
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


# --------------------------------------------------------------------------- DEL
def del_per_position(logits_digits, target_digit, place_weight=1.0) -> np.ndarray:
    """DEL loss of each target-digit position.

    logits_digits: [..., 10] raw logits of the tokens '0'..'9' (in digit order).
    target_digit:  [...] int in 0..9.
    place_weight:  [...] (or scalar) place weight w; pass 1.0 for the unweighted term.
    Returns [...]: w * sum_k softmax(z)_k * BCE_with_logits(z_k, 1[k == y]).

    NB: BCE uses the *raw* logits (sigmoid of each logit on its own), so unlike the
    softmax part it is not invariant to adding a constant to all 10 logits.
    """
    z = np.asarray(logits_digits, dtype=np.float64)
    if z.shape[-1] != 10:
        raise ValueError("logits_digits must have a trailing axis of size 10")
    y = np.asarray(target_digit)
    if np.any((y < 0) | (y > 9)):
        raise ValueError("target_digit must be in 0..9")
    onehot = (np.arange(10) == y[..., None]).astype(np.float64)
    # BCE_with_logits(z, t) = t * softplus(-z) + (1 - t) * softplus(z)
    bce = onehot * _softplus(-z) + (1.0 - onehot) * _softplus(z)
    p = np.exp(_log_softmax(z, axis=-1))
    w = np.asarray(place_weight, dtype=np.float64)
    return w * np.sum(p * bce, axis=-1)


def del_batch_reduction(per_position_weighted: np.ndarray, scale: float = 0.01) -> float:
    """Their reduction: ``scale * (criterion_entropy * place[:, None]).mean()`` where the
    mean runs over N_digit_positions x 10 elements, i.e. scale/10 * mean over positions.
    ``per_position_weighted`` = del_per_position(...) with the place weights applied,
    for all digit target positions of the (micro)batch.  Returns 0.0 if empty
    (their code returns the Python int 0 then)."""
    v = np.asarray(per_position_weighted, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return 0.0
    return float(scale * v.sum() / (10.0 * v.size))


def _token_kind(tok) -> str:
    if isinstance(tok, str) and len(tok) == 1 and tok in DIGITS:
        return "digit"
    if tok == ".":
        return "dot"
    return "other"  # anything else, incl. None / ignored positions, '-', ',', ' '


def _run_weights(run: Sequence[str]) -> np.ndarray:
    """Place weights of one maximal run of digit/'.' tokens (DEL's generate_place).

    n = len(run); d = index of the FIRST '.' in the run (None if no '.').
    * d is None or d == 0 ("no usable point"): the run is read as an integer whose
      last position is the ones place: token at index j gets place k = n - j, and a
      digit there gets weight 2k.  (With d == 0, '.' tokens still occupy positions.)
    * d > 0: digit at j < d gets 2*(d - j)  (ones = 2, tens = 4, hundreds = 6, ...);
      digit at j > d gets 1.02 ** -(j - d + 1)  (first decimal 1/1.02^2, second
      1/1.02^3, ...; counted by position, so later '.' tokens also occupy a slot).
    * every '.' gets 0.
    """
    n = len(run)
    kinds = [_token_kind(t) for t in run]
    dots = [j for j, k in enumerate(kinds) if k == "dot"]
    d = dots[0] if dots else None
    w = np.zeros(n, dtype=np.float64)
    for j, kind in enumerate(kinds):
        if kind != "digit":
            continue  # '.' -> 0
        if d is None or d == 0:
            w[j] = 2.0 * (n - j)
        elif j < d:
            w[j] = 2.0 * (d - j)
        else:  # j > d
            w[j] = 1.02 ** (-(j - d + 1))
    return w


def _weights_one_stream(tokens: Sequence[str]) -> np.ndarray:
    kinds = [_token_kind(t) for t in tokens]
    out = np.zeros(len(tokens), dtype=np.float64)
    j = 0
    while j < len(tokens):
        if kinds[j] == "other":
            j += 1
            continue
        k = j
        while k < len(tokens) and kinds[k] != "other":
            k += 1
        out[j:k] = _run_weights(tokens[j:k])
        j = k
    return out


def del_place_weights(
    token_strings_per_sequence: Sequence[Sequence[str]],
    join_across_sequences: bool = False,
) -> List[np.ndarray]:
    """Place weight of every target position, as DEL's ``generate_place`` defines it.

    token_strings_per_sequence: list of sequences; each is a list of single-character
      target-token strings.  '0'..'9' are digits, '.' is the point, anything else
      (including None for ignored/-100 positions, '-', ',', ' ') is "other".
    A number = maximal run of consecutive digit/'.' tokens; any "other" token ends
      it.  Weights inside a run follow ``_run_weights``; "other" tokens and '.' get 0.

    Sequence boundaries (join_across_sequences=False, the default and what we use):
      a run ends at the end of its sequence and never continues into the next one.
    Their code (join_across_sequences=True): they keep only the non-ignored target
      positions of the whole flattened batch [B*(T-1)] and find runs over that 1-D
      stream, so the last valid target of sequence b is adjacent to the first valid
      target of sequence b+1 (padding / prompt positions are removed, not breaking).
      Runs therefore join across sequences when sequence b's last valid target is a
      digit/'.' (e.g. EOS truncated away) and sequence b+1's first valid target is a
      digit/'.'.  To mimic that, pass only the valid target tokens of each sequence
      and set join_across_sequences=True.
    Returns a list of float64 arrays, one per sequence, same lengths as the inputs.
    """
    seqs = [list(s) for s in token_strings_per_sequence]
    if not join_across_sequences:
        return [_weights_one_stream(s) for s in seqs]
    flat = [t for s in seqs for t in s]
    wflat = _weights_one_stream(flat)
    out, i = [], 0
    for s in seqs:
        out.append(wflat[i:i + len(s)])
        i += len(s)
    return out


# --------------------------------------------------------------------------- DIST^2
def dist2_target_distribution(values, target_value, tau: float = 1.0) -> np.ndarray:
    """p_d(j) = exp(-(v_j - y)^2 / tau) / sum_j' exp(-(v_j' - y)^2 / tau).  [..., N]"""
    v = np.asarray(values, dtype=np.float64)
    y = np.asarray(target_value, dtype=np.float64)[..., None]
    return np.exp(_log_softmax(-((v - y) ** 2) / float(tau), axis=-1))


def dist2_per_position(logits_numbers, values, target_value, tau: float = 1.0,
                       log_normalizer: Optional[np.ndarray] = None) -> np.ndarray:
    """KL(p_d || p_theta) at each position.

    logits_numbers: [..., N] logits of the N number tokens.
    values:         [N] numeric value of each number token.
    target_value:   [...] numeric value of the target token.
    tau:            temperature of p_d (paper default 1 for digits).
    log_normalizer: None (default) -> p_theta = softmax over the N number logits only
                    (what every implementation found does).  If given ([...], the
                    full-vocabulary logsumexp), p_theta(j) = exp(logit_j - log_normalizer)
                    i.e. full-vocab probabilities restricted to the N tokens, NOT
                    renormalized; then the result equals KL(p_d||softmax_N) - log P(V_d).
    Returns [...] (float64).  The loss actually trained is CE + alpha * mean(KL)
    (alpha = 0.1 in the paper).
    """
    z = np.asarray(logits_numbers, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    y = np.asarray(target_value, dtype=np.float64)[..., None]
    log_pd = _log_softmax(-((v - y) ** 2) / float(tau), axis=-1)
    if log_normalizer is None:
        log_q = _log_softmax(z, axis=-1)
    else:
        log_q = z - np.asarray(log_normalizer, dtype=np.float64)[..., None]
    pd = np.exp(log_pd)
    # p_d > 0 everywhere in exact arithmetic; where it underflows to 0 the term is 0.
    terms = np.where(pd > 0.0, pd * (log_pd - log_q), 0.0)
    return np.sum(terms, axis=-1)


# --------------------------------------------------------------------------- SMMD
def smmd_vnum(pieces: Sequence[str], max_value: int = 999):
    """(values, token_ids) of V_num as the authors' ``build_integer_vnum_from_tokenizer``
    probes it: each integer 0..max_value whose decimal string ``str(v)`` is one token (here:
    one piece), sorted by value. The first id of a piece that occurs twice, as a
    tokenizer's ``encode`` would give one."""
    first = {}
    for i, piece in enumerate(pieces):
        first.setdefault(piece, i)
    values = [v for v in range(int(max_value) + 1) if str(v) in first]
    return np.asarray(values, np.float64), np.asarray([first[str(v)] for v in values], np.int64)


def smmd_kernel(values, sigma: float = 2.0, squash_factor: float = 9.0) -> np.ndarray:
    """The authors' ``build_kernel_matrix`` (VALUE_DISTANCE, gaussian, one sigma)."""
    v = np.asarray(values, np.float64)
    dist = np.abs(v[:, None] - v[None, :])
    if squash_factor is not None and squash_factor > 1.0 and dist.size > 1:  # squash_distances
        nonzero = dist > 0
        if nonzero.any():
            min_nz, max_v = dist[nonzero].min(), dist.max()
            if max_v > min_nz:
                scale = (float(squash_factor) - 1.0) / (max_v - min_nz + 1e-10)
                out = 1.0 + (dist - min_nz) * scale
                out[dist == 0] = 0.0
                dist = out
    return np.clip(np.exp(-(dist ** 2) / (2.0 * float(sigma) ** 2)), 0.0, 1.0)


def smmd_per_position(logits, targets, pieces, *, mode: str = "smmd", sigma: float = 2.0,
                      squash_factor: float = 9.0, alpha: Optional[float] = None, max_value: int = 999):
    """(loss, counted), each [...]: the authors' ``SMMDLoss.forward`` before its mean, at
    every position, from the full logits [..., V] and target ids [...]. ``counted``: the
    target is in V_num (``_numeric_target_mask``); the loss is 0 elsewhere.

    As theirs, r'Kr and r'Dr are expanded with the one-hot q (no r formed)::

        r'Kr = p'Kp + K_tt - 2 (K p)_t,   r'Dr = sum_i deg_i p_i^2 + deg_t (1 - 2 p_t)
        loss = relu(r'Kr + alpha (r'Dr - r'Kr)),  alpha = 0.5 / mean(deg)  ("auto")
    """
    values, ids = smmd_vnum(pieces, max_value)
    kernel = smmd_kernel(values, sigma, squash_factor)
    deg = kernel.sum(axis=1)
    alpha = 0.5 / max(deg.mean(), 1e-12) if alpha is None else float(alpha)
    targets = np.asarray(targets)
    index = {int(i): k for k, i in enumerate(ids)}
    counted = np.vectorize(lambda t: int(t) in index)(targets)
    y = np.vectorize(lambda t: index.get(int(t), 0))(targets)
    z = np.asarray(logits, np.float64)[..., ids]
    p = np.exp(_log_softmax(z, axis=-1))
    pk = p @ kernel
    term_pp = np.sum(pk * p, axis=-1)
    term_qp = np.sum(kernel[y] * p, axis=-1)
    term_qq = np.diag(kernel)[y]
    mmd = term_pp + term_qq - 2.0 * term_qp
    p_t = np.take_along_axis(p, y[..., None], axis=-1)[..., 0]
    term_dr = np.sum(p * p * deg, axis=-1) + deg[y] * (1.0 - 2.0 * p_t)
    smooth = term_dr - mmd
    raw = {"mmd": mmd, "smooth": alpha * smooth, "smmd": mmd + alpha * smooth}[mode]
    return np.where(counted, np.maximum(raw, 0.0), 0.0), counted
