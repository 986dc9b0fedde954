"""Forward+backward time and peak memory of cross-entropy alone vs cross-entropy + NTL.

Two usages, each its own table (`--usage objective|standalone|both`, default both).

Objective: for each logits shape and dtype, the jitted `value_and_grad` (gradient with
respect to the logits) of

- `ce`: `ntl_jax.cross_entropy_and_ntl(..., number_loss=None)`, the reference;
- `optax_ce`: `optax.softmax_cross_entropy_with_integer_labels(...).sum()`, a plain baseline;
- `<kind>` / `<kind>+rw`: `cross_entropy_and_ntl(..., number_loss=ntl_jax.losses.<kind>(reweigh=False/True))`
  for kind in was, mse, mae, huber, number_level;

and, when `ntloss` and `torch` are installed, the same objectives written with torch
cross-entropy + ntloss 0.3.2 (`NTLoss`, `NTLossDotProduct`, `NumberLevelLoss`, reweigh
matching), forward+backward with autograd. All variants of one shape/dtype run
interleaved (round-robin, start rotated every round) so load changes on a shared machine
hit them alike; each row reports the median over rounds of the per-round time ratio and
a distribution-free 95% interval for that median (order statistics of the ratios).

Each table also times its reference a second time, compiled on its own: the row
`<reference> (again)` runs the identical program, so its ratio and interval show what
the machine's noise alone does to a ratio. A variant whose interval lies within that
row's is indistinguishable from the reference here.

Standalone ("optax CE + standalone loss"): the losses as many users call them, inside
their own step next to their own cross-entropy, with a weights mask (about 10% zeros):

- `optax_ce`: `mean(optax.softmax_cross_entropy_with_integer_labels(lg, t))`, the reference;
- `was` / `was+rw`: `optax_ce + 0.3 * ntl_jax.ntl_was(lg, t, nt, weights=w, reduction="mean")`;
- `mse`, `mae`, `huber` (and `+rw`): the same with `ntl_jax.ntl_dot(..., loss_function=kind)`;
- `number_level` (and `+rw`): the same with `ntl_jax.number_level_loss(...)`.

With `--floors` the standalone table has two more rows, lower bounds for what any NTL
gradient can cost next to optax's CE on this machine:

- `floor: was, value only`: `optax_ce + 0.3 * ntl_was(stop_gradient(lg), ...)`: NTL's
  forward pass (the number columns and the `[B, L, N]` work), no NTL gradient at all;
- `floor: one select`: `optax_ce + 0.3 * mean(head_stats.take_target_logit(lg, t))`: a
  gradient of one compare and select per element, fused into optax's. An NTL gradient
  writes N scattered columns: either N such selects or a scatter-add (which XLA's CPU
  backend widens to a float32 buffer when the logits are 16-bit).

Targets and weights are arguments of the jitted function (not closed over, which would let
XLA constant-fold parts of the gradient). With `--usage both`, the variants of both tables
run interleaved in the same rounds; each table's ratios are against its own reference.

Peak memory of a JAX variant is XLA's compiled memory analysis (arguments + outputs +
temporaries - aliased), reported as a ratio vs the table's reference.

    python benchmarks/loss_overhead.py                 # full run (~15 min on 2 cores)
    python benchmarks/loss_overhead.py --quick         # tiny shapes, a few seconds
    python benchmarks/loss_overhead.py --shapes 8x64x32128 --dtypes f32 --repeats 20
    python benchmarks/loss_overhead.py --usage standalone --out results/overhead.json
    python benchmarks/loss_overhead.py --vocab llama3 --kinds was,mse --no-ntloss   # 1,110 number tokens

`--vocab llama3` swaps T5's ten digits for a LLaMA-3-like table (`vocabularies.py`):
vocabulary 128,256 with the 1,110 number pieces 0-999, 00-09 and 000-099 at scattered ids.

On a GPU, `--calls 10` queues ten steps per timed sample (dispatch would weigh in on one),
`--hbm-floor` times reading the logits and writing as much beside the variants, and
`--formulations all` compiles each NTL variant in each formulation of the number
statistics (src/ntl_jax/_core/number_stats.py; each variant's number tokens name theirs,
`with_formulation`):

    python benchmarks/loss_overhead.py --shapes 8x1024x32128 --formulations all --hbm-floor --calls 10 --no-ntloss
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from vocabularies import VOCABS, llama3_number_tokens, llama3_pieces, sample_targets

KINDS = ("was", "mse", "mae", "huber", "number_level")
# Also accepted by --kinds: NTL's successors and NTIL (T5's digits only), which take no
# reweigh (no "+rw" variant).
SUCCESSOR_KINDS = ("del", "dist2", "smmd", "ntil")
USAGES = ("objective", "standalone")
HBM_FLOOR = "read + write the logits"
DEFAULT_SHAPES = "8x64x32128,32x128x32128"
QUICK_SHAPES = "2x8x64"
LLAMA3_SHAPES = "4x128x128256,8x128x128256"
LLAMA3_QUICK_SHAPES = "2x8x128256"
NTL_WEIGHT = 0.3
# Share of target positions that are digits: the NTL terms are computed at every
# position in ntl_jax (masks), but only at digit positions in ntloss (boolean indexing).
DIGIT_SHARE = 0.5
# Share of positions the standalone usage's weights mask out (padding, prompt tokens).
MASKED_SHARE = 0.1


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"expected shapes like 8x64x32128 (batch x length x vocab), got {item!r}")
        batch, length, vocab = map(int, parts)
        if vocab < 16:
            raise ValueError(f"expected a vocabulary of at least 16 pieces (digits + specials), got {vocab}")
        shapes.append((batch, length, vocab))
    return shapes


def parse_dtypes(text: str) -> list[str]:
    dtypes = [d.strip() for d in text.split(",")]
    for d in dtypes:
        if d not in ("f32", "bf16"):
            raise ValueError(f"expected dtypes from f32, bf16, got {d!r}")
    return dtypes


def vocabulary_pieces(vocab: int) -> list[str]:
    """`vocab` pieces with the digits 0-9 exactly once, a dot, specials and filler words."""
    head = ["<pad>", "</s>", "<unk>", "."] + [str(d) for d in range(10)]
    return head + [f"w{i}" for i in range(vocab - len(head))]


def hf_tokenizer(pieces: list[str]):
    """A word-level Hugging Face tokenizer whose vocabulary is exactly `pieces`."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")


def parse_formulations(text: str) -> tuple:
    """`(None,)` for "backend" (each backend's own), else the formulations named."""
    from ntl_jax._core.number_stats import FORMULATIONS

    if text == "backend":
        return (None,)
    if text == "all":
        return FORMULATIONS
    names = tuple(f.strip() for f in text.split(","))
    for name in names:
        if name not in FORMULATIONS:
            raise ValueError(f"expected --formulations backend, all or names from {', '.join(FORMULATIONS)}, "
                             f"got {name!r}")
    return names


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(","))
    for k in kinds:
        if k not in KINDS + SUCCESSOR_KINDS:
            raise ValueError(f"expected kinds from {', '.join(KINDS + SUCCESSOR_KINDS)}, got {k!r}")
    return kinds


def vocabulary(vocab_kind: str, vocab: int):
    """`(pieces, number_tokens)` of the `--vocab` table at `vocab` pieces."""
    import ntl_jax

    if vocab_kind == "llama3":
        return llama3_pieces(vocab), llama3_number_tokens(vocab)
    pieces = vocabulary_pieces(vocab)
    return pieces, ntl_jax.NumberTokens.from_pieces(pieces)


def make_inputs(shape, seed=0, number_ids=None):
    """Random logits (f32) and targets: about DIGIT_SHARE number tokens (by default
    the digits, ids 4-13), the rest other pieces (by default ids 14 on: no specials)."""
    batch, length, vocab = shape
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(shape, dtype=np.float32) * 2.0)
    if number_ids is None:
        number_ids, other_ids = np.arange(4, 14), np.arange(14, vocab)
    else:
        other_ids = np.setdiff1d(np.arange(vocab), number_ids)
    return logits, sample_targets(rng, (batch, length), number_ids, other_ids, DIGIT_SHARE)


def make_weights(shape, seed=0):
    """A [batch, length] float32 mask with about MASKED_SHARE zeros."""
    rng = np.random.default_rng(seed + 1)
    return (rng.uniform(size=shape[:2]) >= MASKED_SHARE).astype(np.float32)


# -- JAX variants ---------------------------------------------------------------------


def number_loss(kind: str, reweigh: bool = False):
    """The `ntl_jax.losses` value of the spec name `kind` (reweigh only when set: NTL's
    successors take none)."""
    from ntl_jax import losses

    return losses.LOSSES[kind](**({"reweigh": True} if reweigh else {}))


def jax_variants(number_tokens, kinds=KINDS, formulation="auto") -> dict[str, Callable]:
    """name -> scalar loss(logits, targets); jitted with its logits gradient later.
    `formulation`: of the number statistics ("auto": each backend's own), named by the
    number tokens the variants close over."""
    import jax.numpy as jnp
    import optax

    import ntl_jax
    from ntl_jax._core.number_stats import with_formulation

    number_tokens = with_formulation(number_tokens, formulation)

    def objective(kind, reweigh):
        value = None if kind == "none" else number_loss(kind, reweigh)

        def loss(logits, targets):
            return ntl_jax.cross_entropy_and_ntl(
                logits, targets, number_tokens, number_loss=value, ntl_weight=NTL_WEIGHT,
            )[0]

        return loss

    variants = {
        "ce": objective("none", False),
        "ce (again)": objective("none", False),
        "optax_ce": lambda logits, targets: jnp.sum(
            optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        ),
    }
    for kind in kinds:
        for reweigh in (False, True)[:1 if kind in SUCCESSOR_KINDS else 2]:
            variants[kind + ("+rw" if reweigh else "")] = objective(kind, reweigh)
    return variants


def standalone_variants(number_tokens, kinds=KINDS, floors=False, formulation="auto") -> dict[str, Callable]:
    """name -> scalar loss(logits, targets, weights): the user's own optax cross-entropy,
    plus 0.3 x a standalone ntl_jax loss; with `floors`, two lower bounds for any NTL
    gradient (see the module docstring). `formulation`: of the NTL losses' number
    statistics ("auto": each backend's own; the floors always take "auto")."""
    import jax
    import jax.numpy as jnp
    import optax

    import ntl_jax
    from ntl_jax._core import head_stats
    from ntl_jax._core.number_stats import with_formulation

    table = number_tokens  # the floors': each backend's own formulation
    number_tokens = with_formulation(number_tokens, formulation)

    def ce(logits, targets, weights):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    def plus(kind, reweigh):
        if kind == "was":
            def ntl(lg, t, w):
                return ntl_jax.ntl_was(lg, t, number_tokens, weights=w, reweigh=reweigh, reduction="mean")
        elif kind == "number_level":
            def ntl(lg, t, w):
                return ntl_jax.number_level_loss(lg, t, number_tokens, weights=w, reweigh=reweigh,
                                                 reduction="mean")
        elif kind in SUCCESSOR_KINDS:
            def ntl(lg, t, w):
                return ntl_jax.number_token_loss(lg, t, number_tokens, weights=w, number_loss=number_loss(kind),
                                                 reduction="mean")
        else:
            def ntl(lg, t, w):
                return ntl_jax.ntl_dot(lg, t, number_tokens, weights=w, loss_function=kind, reweigh=reweigh,
                                       reduction="mean")

        def loss(logits, targets, weights):
            return ce(logits, targets, weights) + NTL_WEIGHT * ntl(logits, targets, weights)

        return loss

    variants = {"optax_ce": ce, "optax_ce (again)": ce}
    for kind in kinds:
        for reweigh in (False, True)[:1 if kind in SUCCESSOR_KINDS else 2]:
            variants[kind + ("+rw" if reweigh else "")] = plus(kind, reweigh)
    if floors:
        def value_only(logits, targets, weights):
            return ce(logits, targets, weights) + NTL_WEIGHT * ntl_jax.ntl_was(
                jax.lax.stop_gradient(logits), targets, table, weights=weights, reduction="mean")

        def one_select(logits, targets, weights):
            # A gradient of one compare and select per element, fused into optax's.
            return ce(logits, targets, weights) + NTL_WEIGHT * jnp.mean(
                head_stats.take_target_logit(logits, targets))

        variants["floor: was, value only"] = value_only
        variants["floor: one select"] = one_select
    return variants


def lowered_step(loss_fn, logits, *rest):
    """value_and_grad w.r.t. logits, jitted and lowered; `rest` (targets, weights) are
    arguments of the jitted function, not constants."""
    import jax

    return jax.jit(jax.value_and_grad(loss_fn)).lower(logits, *rest)


def compile_lowered(lowered):
    """(compiled step, peak bytes from XLA's memory analysis)."""
    compiled = lowered.compile()
    mem = compiled.memory_analysis()
    peak = None
    if mem is not None:
        peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                - mem.alias_size_in_bytes)
    return compiled, peak


# -- ntloss + torch variants ------------------------------------------------------------


def ntloss_available() -> bool:
    try:
        import ntloss  # noqa: F401
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def torch_variants(tokenizer, kinds=KINDS) -> dict[str, Callable]:
    """name -> scalar loss(logits, labels) with torch cross-entropy (+ 0.3 * ntloss)."""
    import ntloss
    import torch.nn.functional as F

    def ce(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")

    def build(kind, reweigh):
        if kind == "was":
            obj = ntloss.NTLoss(tokenizer, reweigh=reweigh)
        elif kind == "number_level":
            obj = ntloss.NumberLevelLoss(tokenizer, reweigh=reweigh)
        else:
            fn = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}[kind]
            obj = ntloss.NTLossDotProduct(tokenizer, reweigh=reweigh, loss_function=fn)
        return lambda logits, labels: ce(logits, labels) + NTL_WEIGHT * obj(logits, labels, reduction="sum")

    variants = {"ce": ce}
    for kind in (kind for kind in kinds if kind in KINDS):  # ntloss has none of NTL's successors
        for reweigh in (False, True):
            variants[kind + ("+rw" if reweigh else "")] = build(kind, reweigh)
    return variants


# -- measurement ------------------------------------------------------------------------


@dataclass
class Runner:
    """`call` runs the step `calls` times and waits for the last; `times` are per step."""

    name: str
    call: Callable[[], object]
    calls: int = 1
    times: list[float] = field(default_factory=list)
    error: str | None = None

    def once(self) -> None:
        if self.error is not None:
            return
        start = time.perf_counter()
        try:
            self.call()
        except Exception as exc:  # a framework refusing a dtype: report it, keep going
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
            return
        self.times.append((time.perf_counter() - start) / self.calls)


def round_ratios(num: Runner, den: Runner) -> list[float] | None:
    """num/den of every round (both timed in it); None if either failed."""
    if num.error or den.error:
        return None
    return [a / b for a, b in zip(num.times, den.times)]


def median_ratio(num: Runner, den: Runner) -> float | None:
    """Median over rounds of num/den measured in the same round."""
    ratios = round_ratios(num, den)
    return statistics.median(ratios) if ratios else None


def ratio_quartiles(num: Runner, den: Runner) -> list[float] | None:
    """`[q1, q3]` of the per-round ratios num/den: their spread on a loaded machine."""
    ratios = round_ratios(num, den)
    if ratios is None or len(ratios) < 2:
        return None
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return [q1, q3]


def median_interval(ratios, confidence=0.95) -> list[float] | None:
    """A distribution-free interval for the median of `ratios`: the order statistics
    `k` and `n + 1 - k` (1-based), `k` the largest with P(Binomial(n, 1/2) < k) <= (1 -
    confidence) / 2, so its coverage is at least `confidence` whatever the ratios'
    distribution. None when there are too few (under 6 rounds at 95%)."""
    n = len(ratios)
    alpha = (1.0 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) < k + 1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > alpha:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(ratios)
    return [ordered[k - 1], ordered[n - k]]


def ratio_interval(num: Runner, den: Runner) -> list[float] | None:
    """`median_interval` of the per-round ratios num/den."""
    ratios = round_ratios(num, den)
    return None if ratios is None else median_interval(ratios)


# Runner keys are "<prefix>:<variant>"; one prefix per table (and one for torch + ntloss).
PREFIX = {"objective": "jax", "standalone": "std"}


def measure_config(shape, dtype_name, repeats, with_ntloss, log, budget_s=60.0, usages=("objective",),
                   vocab_kind="t5", kinds=KINDS, floors=False, formulations=(None,), calls=1, hbm_floor=False):
    """Runners ("jax:<name>", "std:<name>", "ntloss:<name>", and with `hbm_floor`
    "hbm_floor") timed interleaved, peak bytes of the JAX ones (same keys) and the number
    of rounds. Each NTL variant is compiled once per entry of `formulations` (None: the
    backend's own; a name from `number_stats.FORMULATIONS`: that one, named "<variant>
    [<formulation>]");
    each timed sample runs a step `calls` times and waits for the last."""
    import jax
    import jax.numpy as jnp

    pieces, number_tokens = vocabulary(vocab_kind, shape[-1])
    logits_np, targets_np = make_inputs(shape, number_ids=None if vocab_kind == "t5" else number_tokens.ids)
    jdtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    logits = jnp.asarray(logits_np).astype(jdtype)
    targets = jnp.asarray(targets_np, jnp.int32)
    weights = jnp.asarray(make_weights(shape))

    runners: dict[str, Runner] = {}
    peaks: dict[str, int | None] = {}
    compile_start = time.perf_counter()
    lowered = {}  # key -> (name, lowered step, its arguments)
    for usage in usages:
        made = {}  # formulation -> the variants computing their number statistics so

        def variants_in(formulation, usage=usage, made=made):
            if formulation not in made:
                made[formulation] = (jax_variants(number_tokens, kinds, formulation or "auto") if usage == "objective"
                                     else standalone_variants(number_tokens, kinds, floors, formulation or "auto"))
            return made[formulation]

        args = (logits, targets) if usage == "objective" else (logits, targets, weights)
        for name in variants_in(None):
            for formulation in formulations if is_ntl_variant(name) else (None,):
                named = name if formulation is None else f"{name} [{formulation}]"
                fn = variants_in(formulation)[name]
                lowered[f"{PREFIX[usage]}:{named}"] = (named, lowered_step(fn, *args), args)
    # XLA compiles outside the GIL: a thread per CPU shortens the (untimed) compile phase.
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, workers)) as pool:
        compiled = dict(zip(lowered, pool.map(compile_lowered, [low for _, low, _ in lowered.values()])))
    for key, (name, _, args) in lowered.items():
        step, peaks[key] = compiled[key]
        runners[key] = Runner(name, repeated(lambda c=step, a=args: c(*a), calls, jax.block_until_ready), calls)
    if hbm_floor:
        # Reads the logits once and writes as much: what any gradient on them moves at least.
        negate = jax.jit(jnp.negative).lower(logits).compile()
        runners["hbm_floor"] = Runner(HBM_FLOOR, repeated(lambda: negate(logits), calls, jax.block_until_ready),
                                      calls)
    log(f"  compiled {len(peaks)} JAX variants in {time.perf_counter() - compile_start:.1f}s")

    if with_ntloss:
        import torch

        tokenizer = hf_tokenizer(pieces)
        tdtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        # On a GPU torch runs on it too (its own memory: see --calls' help on preallocation).
        device = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
        t_logits = torch.from_numpy(logits_np).to(device, tdtype).requires_grad_(True)
        t_labels = torch.from_numpy(targets_np).to(device)

        def wait(result):
            if device == "cuda":
                torch.cuda.synchronize()
            return result

        def torch_call(fn):
            def call():
                t_logits.grad = None
                fn(t_logits, t_labels).backward()
                return t_logits.grad

            return repeated(call, calls, wait)

        for name, fn in torch_variants(tokenizer, kinds).items():
            runners["ntloss:" + name] = Runner(name, torch_call(fn), calls)

    repeats = interleave(runners, repeats, budget_s, log)
    return runners, peaks, repeats


def is_ntl_variant(name: str) -> bool:
    """Whether a variant computes NTL (so its number statistics have a formulation)."""
    return name.split(" ")[0] in {kind + suffix for kind in KINDS + SUCCESSOR_KINDS for suffix in ("", "+rw")}


def base_variant(name: str) -> str:
    """A variant's name without its " [<formulation>]"."""
    return name.split(" [")[0]


def repeated(step, calls, wait):
    """A call that runs `step` `calls` times (queued, on an accelerator) and `wait`s for the last."""
    def call():
        for _ in range(calls - 1):
            step()
        return wait(step())

    return call


def interleave(runners: dict[str, Runner], repeats, budget_s, log) -> int:
    """Time every runner once per round, in a fresh random order; returns the rounds run."""
    order = list(runners)
    for runner in runners.values():  # warm-up (and first-call costs) outside the timing
        runner.once()
        runner.times.clear()
    # A fresh random order every round: no variant always follows the same one (cache
    # state, memory just freed by torch), so position effects average out.
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    rounds = 0
    # Without --repeats: rounds until the time budget is spent (at least 3, at most 30),
    # which keeps the run length bounded however loaded the machine is.
    while (rounds < repeats) if repeats is not None else (
        rounds < 3 or (rounds < 30 and time.perf_counter() - start < budget_s)
    ):
        for key in rng.permutation(order):
            runners[key].once()
        rounds += 1
    log(f"  {rounds} interleaved rounds of {len(order)} variants in {time.perf_counter() - start:.1f}s")
    return rounds


def table_rows(usage, runners, peaks, repeats) -> list[dict]:
    """One dict per JAX variant of `usage`: ratios vs the usage's reference (`ce` for the
    objective, `optax_ce` standalone); objective rows carry the torch + ntloss times too."""
    prefix = PREFIX[usage]
    ref_key = f"{prefix}:" + ("ce" if usage == "objective" else "optax_ce")
    ref, ref_peak = runners[ref_key], peaks[ref_key]
    floor = runners.get("hbm_floor")
    rows = []
    for key, runner in runners.items():
        if not key.startswith(prefix + ":"):
            continue
        peak = peaks[key]
        row = {
            "usage": usage,
            "variant": runner.name,
            "reference": ref.name,
            "time_ratio": median_ratio(runner, ref),
            "time_ratio_quartiles": ratio_quartiles(runner, ref),
            "time_ratio_ci95": ratio_interval(runner, ref),
            "median_ms": statistics.median(runner.times) * 1e3 if runner.times else None,
            "peak_ratio": None if peak is None or not ref_peak else peak / ref_peak,
            "peak_bytes": peak,
            "rounds": repeats,
            "error": runner.error,
        }
        if floor is not None:
            row["hbm_floor_ratio"] = median_ratio(runner, floor)
            row["hbm_floor_ratio_ci95"] = ratio_interval(runner, floor)
            row["hbm_floor_ms"] = statistics.median(floor.times) * 1e3 if floor.times else None
        other = runners.get("ntloss:" + base_variant(runner.name)) if usage == "objective" else None
        if other is not None:
            row["torch_ntloss_ms"] = statistics.median(other.times) * 1e3 if other.times else None
            row["torch_ntloss_vs_ntl_jax"] = median_ratio(other, runner)
            row["torch_ntloss_error"] = other.error
        rows.append(row)
    return rows


def format_table(shape, dtype_name, runners, peaks, repeats, usage="objective") -> str:
    rows = table_rows(usage, runners, peaks, repeats)
    with_torch = usage == "objective" and "ntloss:ce" in runners
    if usage == "objective":
        title = f"### logits {list(shape)} {dtype_name} ({repeats} rounds)"
        header = ["variant", "time / CE", "95% interval", "median ms", "peak mem / CE", "peak MiB"]
    else:
        title = f"### optax CE + standalone loss: logits {list(shape)} {dtype_name} ({repeats} rounds)"
        header = ["variant", "time / optax CE", "95% interval", "median ms", "peak mem / optax CE", "peak MiB"]
    with_floor = "hbm_floor" in runners
    if with_floor:
        header += ["time / HBM floor"]
    if with_torch:
        header += ["torch(+ntloss) ms", "torch(+ntloss) / ntl_jax"]
    lines = [
        title,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for row in rows:
        ratio, ms, peak, interval = row["time_ratio"], row["median_ms"], row["peak_bytes"], row["time_ratio_ci95"]
        cells = [
            row["variant"],
            "—" if ratio is None else f"{ratio:.3f}",
            "—" if interval is None else f"{interval[0]:.3f}–{interval[1]:.3f}",
            "nan" if ms is None else f"{ms:.1f}",
            "n/a" if row["peak_ratio"] is None else f"{row['peak_ratio']:.3f}",
            "n/a" if peak is None else f"{peak / 2**20:.1f}",
        ]
        if with_floor:
            cells.append("—" if row["hbm_floor_ratio"] is None else f"{row['hbm_floor_ratio']:.2f}")
        if with_torch:
            if "torch_ntloss_ms" not in row:
                cells += ["—", "—"]
            elif row["torch_ntloss_error"]:
                cells += [f"failed ({row['torch_ntloss_error']})", "—"]
            else:
                cells += [f"{row['torch_ntloss_ms']:.1f}", f"{row['torch_ntloss_vs_ntl_jax']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated BxLxV logits shapes (default {DEFAULT_SHAPES}; "
                             f"{LLAMA3_SHAPES} with --vocab llama3)")
    parser.add_argument("--vocab", choices=VOCABS, default="t5",
                        help="number-token table: t5 (default: digits 0-9 once, digit level) or llama3 "
                             "(1,110 number pieces 0-999, 00-09, 000-099 at scattered ids; needs V >= 4096)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated NTL variants to measure (default {','.join(KINDS)}; also "
                             f"{','.join(SUCCESSOR_KINDS)})")
    parser.add_argument("--dtypes", default="f32,bf16", help="comma-separated, from f32, bf16")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved rounds per shape/dtype (default: rounds until --budget "
                             "seconds are spent, 3 to 30; 3 with --quick)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds of timed rounds per shape/dtype when --repeats is not given")
    parser.add_argument("--ntloss-dtypes", default="f32",
                        help="dtypes for which torch + ntloss also run (default f32: bf16 on CPU "
                             "is slow in torch and NTLossDotProduct with Huber fails in bf16)")
    parser.add_argument("--usage", choices=("objective", "standalone", "both"), default="both",
                        help="objective: cross_entropy_and_ntl vs its CE-only setting; standalone: "
                             "optax CE + a standalone ntl_jax loss vs optax CE alone; both (default): "
                             "two tables, all variants interleaved in the same rounds")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="also write every measured row (both tables) to this JSON file")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny shapes ({QUICK_SHAPES}; {LLAMA3_QUICK_SHAPES} with --vocab llama3) for a smoke run")
    parser.add_argument("--floors", action="store_true",
                        help="standalone table: also time two lower bounds for any NTL gradient "
                             "(NTL's value without its gradient; a one-select gradient)")
    parser.add_argument("--formulations", default="backend",
                        help="backend (default): each NTL variant as this backend computes its number "
                             "statistics; all, or a comma-separated list from columns, gathered, reductions "
                             "(src/ntl_jax/_core/number_stats.py): each variant once in each, named "
                             "'<variant> [<formulation>]'")
    parser.add_argument("--calls", type=int, default=1,
                        help="steps per timed sample, queued before waiting for the last (default 1); on a "
                             "GPU 10 or more, so a sample outlasts the dispatch. With torch + ntloss on the "
                             "same GPU, set XLA_PYTHON_CLIENT_PREALLOCATE=false so JAX leaves torch memory")
    parser.add_argument("--hbm-floor", action="store_true",
                        help="also time reading the logits and writing as much (jnp.negative), the least "
                             "any gradient on them moves, and give every variant's time over it")
    parser.add_argument("--no-ntloss", action="store_true", help="skip the torch + ntloss comparison")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the CPUs this process may use)")
    return parser


def run(argv=None) -> int:
    command = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(command)
    llama3 = args.vocab == "llama3"
    default_shapes = {(False, False): DEFAULT_SHAPES, (False, True): QUICK_SHAPES,
                      (True, False): LLAMA3_SHAPES, (True, True): LLAMA3_QUICK_SHAPES}[llama3, args.quick]
    try:
        shapes = parse_shapes(args.shapes or default_shapes)
        dtypes = parse_dtypes(args.dtypes)
        ntloss_dtypes = parse_dtypes(args.ntloss_dtypes) if args.ntloss_dtypes else []
        kinds = parse_kinds(args.kinds)
        if llama3:
            for shape in shapes:
                llama3_pieces(shape[-1])  # the vocabulary must hold the number tokens
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.repeats is not None and args.repeats < 1:
        print(f"error: expected --repeats >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    if args.calls < 1:
        print(f"error: expected --calls >= 1, got {args.calls}", file=sys.stderr)
        return 2
    try:
        formulations = parse_formulations(args.formulations)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import jax

    from ntl_jax.train.machine import cpu_model

    usages = USAGES if args.usage == "both" else (args.usage,)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # torch + ntloss is compared with the objective table only, on T5's digits (ntloss's
    # NTLoss reads digit tokens only: it has no table of multi-digit pieces to compare).
    with_ntloss = "objective" in usages and not args.no_ntloss and not llama3 and ntloss_available()
    threads = args.threads or cpus

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    date = datetime.datetime.now().isoformat(timespec="seconds")
    machine = f"{cpu_model()}, nproc {os.cpu_count()}, usable CPUs {cpus}"
    print("## NTL overhead: forward+backward (gradient w.r.t. logits), jitted\n")
    print(f"- date: {date}")
    load_start = os.getloadavg()[0]
    print(f"- machine: {machine}, load average {load_start:.2f} at start")
    device = jax.devices()[0]
    print(f"- jax {jax.__version__} on {device.platform} ({device.device_kind}) "
          f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
    if args.calls > 1:
        print(f"- each timed sample: {args.calls} steps queued, then a wait for the last; times are per step")
    if formulations != (None,):
        print("- `[<formulation>]`: how the number statistics are computed (src/ntl_jax/_core/number_stats.py):"
              " `columns`, from the number columns, their gradient scattered back; `gathered`, the same,"
              " their gradient gathered back through a [vocab] slot map; `reductions`, by masked reductions"
              " over the vocabulary")
    if args.hbm_floor:
        print("- time / HBM floor: over reading the logits and writing as much (jnp.negative), timed in the"
              " same rounds: the least any gradient on the logits moves")
    if with_ntloss:
        import ntloss
        import torch

        torch.set_num_threads(threads)
        print(f"- torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
              f"ntloss {getattr(ntloss, '__version__', '0.3.2')}")
    elif "objective" in usages:
        why = "--no-ntloss" if args.no_ntloss else "--vocab llama3" if llama3 else "not installed"
        print(f"- torch + ntloss comparison: skipped ({why})")
    if with_ntloss:
        print(f"- torch + ntloss run for: {', '.join(ntloss_dtypes) or 'none'}")
    if llama3:
        nt = llama3_number_tokens(shapes[0][-1])
        print(f"- vocabulary: LLaMA-3-like, {len(nt.ids):,} number tokens (0-999, 00-09, 000-099; digit_level=False) "
              f"at scattered ids among {nt.vocab_size:,}")
    else:
        print("- vocabulary: T5-like, the digits 0-9 once (digit level)")
    noun = "number tokens" if llama3 else "digits"
    print(f"- {int(DIGIT_SHARE * 100)}% of targets are {noun}; time ratios"
          + (" (and torch / ntl_jax)" if with_ntloss else "")
          + " are medians of per-round ratios, with a distribution-free 95% interval for the median;"
          + " every round runs all variants" + (" (of all tables)" if len(usages) > 1 else "")
          + " once in a fresh random order")
    print("- `<reference> (again)`: the reference compiled a second time, the same program: its ratio is"
          " the machine's noise alone")
    if "objective" in usages:
        print(f"- objective table: cross_entropy_and_ntl, CE (sum) + {NTL_WEIGHT} x NTL (sum), vs "
              "number_loss=None")
    if args.floors and "standalone" in usages:
        print("- `floor:` rows: lower bounds for any NTL gradient here: NTL-WAS's value without its gradient;"
              " a gradient of one compare and select per element")
    if "standalone" in usages:
        print(f"- standalone table: mean optax CE + {NTL_WEIGHT} x ntl_was / ntl_dot / number_level_loss "
              f'(weights=mask with {int(MASKED_SHARE * 100)}% zeros, reduction="mean") vs mean optax CE; '
              "targets and weights are jit arguments")
    print("- peak mem: XLA compiled memory analysis (arguments + outputs + temporaries)\n")
    sys.stdout.flush()

    rows = []
    for shape in shapes:
        for dtype_name in dtypes:
            repeats = 3 if args.quick and args.repeats is None else args.repeats
            log(f"logits {list(shape)} {dtype_name}")
            runners, peaks, repeats = measure_config(
                shape, dtype_name, repeats, with_ntloss and dtype_name in ntloss_dtypes, log, args.budget,
                usages, args.vocab, kinds, args.floors, formulations, args.calls, args.hbm_floor)
            for usage in usages:
                print(format_table(shape, dtype_name, runners, peaks, repeats, usage) + "\n", flush=True)
                rows += [{"shape": "x".join(map(str, shape)), "dtype": dtype_name, "vocab": args.vocab, **row,
                          "date": date, "jax": jax.__version__, "machine": machine}
                         for row in table_rows(usage, runners, peaks, repeats)]
    if args.out:
        # date / jax / machine also in every row, so files of split runs can be merged.
        payload = {"date": date, "jax": jax.__version__, "device": device.platform,
                   "device_kind": device.device_kind, "calls": args.calls, "formulations": args.formulations,
                   "machine": machine, "vocab": args.vocab, "load_average": [load_start, os.getloadavg()[0]],
                   "command": " ".join(["python", "benchmarks/loss_overhead.py", *command]),
                   "ntl_weight": NTL_WEIGHT, "digit_share": DIGIT_SHARE,
                   "masked_share": MASKED_SHARE, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
        log(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
