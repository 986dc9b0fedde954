"""Numbers written over several tokens: runs of number-token targets joined into whole
numbers (the number-level loss) and each token's place in its number (DEL).

Segmented scans along the length axis, no scatter or gather (on the TPU each gathered or
scattered element costs a memory tile).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# ntloss's NumberLevelLoss precomputes powers of ten up to this many digits.
MAX_PLACES = 20


def _shift_right(x, fill):
    """x[:, t-1] at position t, `fill` at t = 0."""
    return jnp.concatenate([jnp.full_like(x[:, :1], fill), x[:, :-1]], axis=1)


def _shift_left(x, fill):
    """x[:, t+1] at position t, `fill` at the last position."""
    return jnp.concatenate([x[:, 1:], jnp.full_like(x[:, :1], fill)], axis=1)


def _suffix_sums(x, ends):
    """`[batch, length]`: the sum of `x` from each position to the end of its segment
    along the length axis, segments ending at the positions `ends` (True)."""
    def add(later, earlier):  # in scan order: from the end of the row
        (x_later, end_later), (x_earlier, end_earlier) = later, earlier
        return jnp.where(end_earlier, x_earlier, x_later + x_earlier), end_later | end_earlier

    return jax.lax.associative_scan(add, (x, ends), reverse=True, axis=1)[0]


def join_digit_runs(is_digit, digit_values, targets=None, dot_id=None, digit_counts=None, opens=None,
                    max_places=None):
    """Joins runs of number tokens into numbers, placing each number at its first token.

    The vectorised twin of ntloss's `NumberLevelLoss.convert_digits_to_numbers`: a run
    of consecutive digits d_1..d_k is the number sum_i d_i 10^(k-i); when `dot_id` is
    given, a single `.` between two digits does not break the run (and contributes
    nothing, so 12.34 reads as 1234, as in ntloss).

    Multi-digit tokens (beyond ntloss, whose number-level loss takes single digits only):
    with `digit_counts`, each token is placed by the digits the tokens after it in its
    run write, `sum_i v_i 10^(c_{i+1} + ... + c_k)`, so the pieces "123", "4" read 1234
    and "12", "007" read 12007 (leading zeros count). A number token that writes no
    plain digits (count 0: "-1", "3.5", "1e3") is a number of its own: it breaks runs on
    both sides and is its own value, since a sign, point or exponent has no place in a
    run of digits. Places beyond `10^(max_places - 1)` are clipped to it, as
    ntloss's powers of ten (20 places by default: 10^19).

    Args:
      is_digit: `[batch, length]` bool, the number-token positions.
      digit_values: `[batch, length]` values (any real values at number positions).
      targets: `[batch, length]` token ids, needed only with `dot_id`.
      dot_id: the id of `.`, or None to let a dot break numbers.
      digit_counts: `[batch, length]` int, the digits each position's target writes
        (`NumberTarget.digits`), or None for single-digit tokens (1 at every number).
      opens: `[batch, length]` bool, True where a target begins a new number whatever
        precedes it (a space-marked piece such as "Ġ12"), or None for none.
      max_places: the most places a number has (None: ntloss's 20); the digits
        of a longer number all take the highest place.

    Returns:
      `(starts, numbers)`: `starts` `[batch, length]` marks the first token of each
      number, `numbers` holds its value there (and 0 elsewhere).
    """
    if digit_counts is None:
        joins, counts = is_digit, is_digit.astype(jnp.int32)
    else:
        counts = jnp.where(is_digit, digit_counts, 0).astype(jnp.int32)
        joins = counts > 0
    alone = is_digit & ~joins  # count-0 number tokens: numbers of one token
    opens = jnp.zeros_like(joins) if opens is None else opens
    digit_prev = _shift_right(joins, False)
    in_number = joins
    continues = digit_prev & ~opens
    if dot_id is not None:
        is_dot = targets == dot_id
        dot_between_digits = is_dot & digit_prev & _shift_left(joins & ~opens, False)
        in_number = joins | dot_between_digits
        continues = (digit_prev | (_shift_right(is_dot, False) & _shift_right(digit_prev, False))) & ~opens
    starts = in_number & ~continues  # always a digit: a dot in a number continues it

    # Sums over the rest of each number, from each position on: a segmented scan from
    # the end of each row (no scatter or gather, which on the TPU cost a memory tile per
    # element), restarting after each number's last token.
    ends = _shift_left(starts | ~in_number, True)
    # Exponent of each token: how many digits of its number come after it.
    places = MAX_PLACES if max_places is None else max_places
    exponent = jnp.clip(_suffix_sums(counts, ends) - counts, 0, places - 1)
    contribution = jnp.where(joins, digit_values * (10.0 ** exponent.astype(jnp.float32)), 0.0)
    numbers = jnp.where(starts, _suffix_sums(contribution, ends), jnp.where(alone, digit_values, 0.0))
    return starts | alone, numbers


def _prefix_sums(x, starts):
    """`[batch, length]`: the sum of `x` from the start of each segment to each position
    (inclusive) along the length axis, segments starting at the positions `starts`."""
    def add(earlier, later):
        (x_earlier, start_earlier), (x_later, start_later) = earlier, later
        return jnp.where(start_later, x_later, x_earlier + x_later), start_earlier | start_later

    return jax.lax.associative_scan(add, (x, starts), axis=1)[0]


def place_weights(target, number_tokens):
    """`[batch, length]` float32: DEL's weight of each target by its place in its number
    (the authors' `generate_place`), 0 off the number tokens.

    A number is a run of number-token and `.` targets within one sequence (an ignored
    position, or any other token, ends it; a space-marked piece such as "Ġ12" opens a
    new one). Its first `.`, unless the run starts with it, is the decimal point. An
    integer digit `k` places left of the point (or of the run's end; ones: 1) weighs
    `2k`; the `m`-th digit after the point `1.02^-(m + 1)`. Places are counted in
    positions, a later `.` taking one as in the authors' code ("1.2.3": 2, 0, 1.02^-2,
    0, 1.02^-4). A multi-digit token ("123") takes the place of its last digit, the
    digits after it counted by `NumberTokens.digit_counts`; a number token with a sign,
    point or exponent ("-1", "3.5") is a number of its own and weighs 2.

    The authors find runs over the whole flattened batch of kept targets, so a number
    that ends one sequence joins one that starts the next; here sequences never join.
    """
    is_dot = (target.ids == number_tokens.dot_id) if number_tokens.dot_id is not None else jnp.zeros_like(
        target.is_number)
    alone = target.is_number & (target.digits == 0)
    in_run = (target.is_number & ~alone) | is_dot
    slots = jnp.where(is_dot, 1, jnp.where(in_run, target.digits, 0)).astype(jnp.int32)
    starts = in_run & ~(_shift_right(in_run, False) & ~target.opens)
    # The decimal point: the run's first dot, unless it opens the run.
    dots_so_far = _prefix_sums(is_dot.astype(jnp.int32), starts | ~in_run)
    point = is_dot & (dots_so_far == 1) & ~starts
    after_point = (_prefix_sums(point.astype(jnp.int32), starts | ~in_run) > 0) & ~point
    # Integer places: slots from each position to the point (exclusive) or the run's end.
    integer = in_run & ~after_point & ~point
    ends = _shift_left(starts | ~in_run | point, True)
    k = _suffix_sums(jnp.where(integer, slots, 0), ends) - slots + 1
    m = _prefix_sums(jnp.where(after_point, slots, 0), starts | ~in_run | point) - slots + 1
    weight = jnp.where(after_point, 1.02 ** -(m.astype(jnp.float32) + 1.0), 2.0 * k.astype(jnp.float32))
    return jnp.where(alone, 2.0, jnp.where(target.is_number & in_run, weight, 0.0))
