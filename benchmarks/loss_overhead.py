"""Forward+backward time and peak memory of cross-entropy alone vs cross-entropy + NTL.

Measures, for each logits shape and dtype, the jitted `value_and_grad` (gradient with
respect to the logits) of

- `ce`: `ntl_jax.cross_entropy_and_ntl(..., ntl_kind="none")`, the reference;
- `optax_ce`: `optax.softmax_cross_entropy_with_integer_labels(...).sum()`, a plain baseline;
- `<kind>` / `<kind>+rw`: `cross_entropy_and_ntl(..., ntl_kind=kind, reweigh=False/True)`
  for kind in was, mse, mae, huber, number_level;

and, when `ntloss` and `torch` are installed, the same objectives written with torch
cross-entropy + ntloss 0.3.2 (`NTLoss`, `NTLossDotProduct`, `NumberLevelLoss`, reweigh
matching), forward+backward with autograd. All variants of one shape/dtype run
interleaved (round-robin, start rotated every round) so load changes on a shared machine
hit them alike; each row reports the median over rounds of the per-round time ratio.

Peak memory of a JAX variant is XLA's compiled memory analysis (arguments + outputs +
temporaries - aliased), reported as a ratio vs `ce`.

    python benchmarks/loss_overhead.py                 # full run (~10 min on 2 cores)
    python benchmarks/loss_overhead.py --quick         # tiny shapes, a few seconds
    python benchmarks/loss_overhead.py --shapes 8x64x32128 --dtypes f32 --repeats 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

KINDS = ("was", "mse", "mae", "huber", "number_level")
DEFAULT_SHAPES = "8x64x32128,32x128x32128"
QUICK_SHAPES = "2x8x64"
NTL_WEIGHT = 0.3
# Share of target positions that are digits: the NTL terms are computed at every
# position in ntl_jax (masks), but only at digit positions in ntloss (boolean indexing).
DIGIT_SHARE = 0.5


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


def make_inputs(shape, seed=0):
    """Random logits (f32) and targets: about DIGIT_SHARE digits in runs, the rest words."""
    batch, length, vocab = shape
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(shape, dtype=np.float32) * 2.0)
    digit_ids = 4 + rng.integers(0, 10, size=(batch, length))
    word_ids = rng.integers(14, vocab, size=(batch, length))
    is_digit = rng.uniform(size=(batch, length)) < DIGIT_SHARE
    targets = np.where(is_digit, digit_ids, word_ids).astype(np.int64)
    return logits, targets


# -- JAX variants ---------------------------------------------------------------------


def jax_variants(number_tokens) -> dict[str, Callable]:
    """name -> scalar loss(logits, targets); jitted with its logits gradient later."""
    import jax.numpy as jnp
    import optax

    import ntl_jax

    def objective(kind, reweigh):
        def loss(logits, targets):
            return ntl_jax.cross_entropy_and_ntl(
                logits, targets, number_tokens, ntl_kind=kind, ntl_weight=NTL_WEIGHT, reweigh=reweigh
            )[0]

        return loss

    variants = {
        "ce": objective("none", False),
        "optax_ce": lambda logits, targets: jnp.sum(
            optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        ),
    }
    for kind in KINDS:
        for reweigh in (False, True):
            variants[kind + ("+rw" if reweigh else "")] = objective(kind, reweigh)
    return variants


def compiled_step(loss_fn, logits, targets):
    """(compiled value_and_grad w.r.t. logits, peak bytes from XLA's memory analysis)."""
    import jax

    compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(logits, targets).compile()
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


def torch_variants(tokenizer) -> dict[str, Callable]:
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
    for kind in KINDS:
        for reweigh in (False, True):
            variants[kind + ("+rw" if reweigh else "")] = build(kind, reweigh)
    return variants


# -- measurement ------------------------------------------------------------------------


@dataclass
class Runner:
    name: str
    call: Callable[[], object]
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
        self.times.append(time.perf_counter() - start)


def median_ratio(num: Runner, den: Runner) -> float | None:
    """Median over rounds of num/den measured in the same round."""
    if num.error or den.error or not num.times or not den.times:
        return None
    return statistics.median(a / b for a, b in zip(num.times, den.times))


def measure_config(shape, dtype_name, repeats, with_ntloss, log, budget_s=60.0):
    import jax
    import jax.numpy as jnp

    import ntl_jax

    pieces = vocabulary_pieces(shape[-1])
    number_tokens = ntl_jax.NumberTokens.from_pieces(pieces)
    logits_np, targets_np = make_inputs(shape)
    jdtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    logits = jnp.asarray(logits_np).astype(jdtype)
    targets = jnp.asarray(targets_np, jnp.int32)

    runners: dict[str, Runner] = {}
    peaks: dict[str, int | None] = {}
    compile_start = time.perf_counter()
    for name, fn in jax_variants(number_tokens).items():
        compiled, peaks[name] = compiled_step(fn, logits, targets)
        runners["jax:" + name] = Runner(name, lambda c=compiled: jax.block_until_ready(c(logits, targets)))
    log(f"  compiled {len(peaks)} JAX variants in {time.perf_counter() - compile_start:.1f}s")

    if with_ntloss:
        import torch

        tokenizer = hf_tokenizer(pieces)
        tdtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        t_logits = torch.from_numpy(logits_np).to(tdtype).requires_grad_(True)
        t_labels = torch.from_numpy(targets_np)

        def torch_call(fn):
            def call():
                t_logits.grad = None
                fn(t_logits, t_labels).backward()
                return t_logits.grad

            return call

        for name, fn in torch_variants(tokenizer).items():
            runners["ntloss:" + name] = Runner(name, torch_call(fn))

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
    repeats = rounds
    log(f"  {repeats} interleaved rounds of {len(order)} variants in {time.perf_counter() - start:.1f}s")
    return runners, peaks, repeats


def format_table(shape, dtype_name, runners, peaks, repeats) -> str:
    ce = runners["jax:ce"]
    ce_peak = peaks["ce"]
    with_torch = "ntloss:ce" in runners
    header = ["variant", "time / CE", "median ms", "peak mem / CE", "peak MiB"]
    if with_torch:
        header += ["torch(+ntloss) ms", "torch(+ntloss) / ntl_jax"]
    lines = [
        f"### logits {list(shape)} {dtype_name} ({repeats} rounds)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for key, runner in runners.items():
        if not key.startswith("jax:"):
            continue
        name = runner.name
        ratio = median_ratio(runner, ce)
        ms = statistics.median(runner.times) * 1e3 if runner.times else float("nan")
        peak = peaks[name]
        cells = [
            name,
            "—" if ratio is None else f"{ratio:.3f}",
            f"{ms:.1f}",
            "n/a" if peak is None or not ce_peak else f"{peak / ce_peak:.3f}",
            "n/a" if peak is None else f"{peak / 2**20:.1f}",
        ]
        if with_torch:
            other = runners.get("ntloss:" + name)
            if other is None:
                cells += ["—", "—"]
            elif other.error:
                cells += [f"failed ({other.error})", "—"]
            else:
                speed = median_ratio(other, runner)
                cells += [f"{statistics.median(other.times) * 1e3:.1f}", f"{speed:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated BxLxV logits shapes (default {DEFAULT_SHAPES})")
    parser.add_argument("--dtypes", default="f32,bf16", help="comma-separated, from f32, bf16")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved rounds per shape/dtype (default: rounds until --budget "
                             "seconds are spent, 3 to 30; 3 with --quick)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds of timed rounds per shape/dtype when --repeats is not given")
    parser.add_argument("--ntloss-dtypes", default="f32",
                        help="dtypes for which torch + ntloss also run (default f32: bf16 on CPU "
                             "is slow in torch and NTLossDotProduct with Huber fails in bf16)")
    parser.add_argument("--quick", action="store_true", help=f"tiny shapes ({QUICK_SHAPES}) for a smoke run")
    parser.add_argument("--no-ntloss", action="store_true", help="skip the torch + ntloss comparison")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the CPUs this process may use)")
    return parser


def run(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES))
        dtypes = parse_dtypes(args.dtypes)
        ntloss_dtypes = parse_dtypes(args.ntloss_dtypes) if args.ntloss_dtypes else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.repeats is not None and args.repeats < 1:
        print(f"error: expected --repeats >= 1, got {args.repeats}", file=sys.stderr)
        return 2

    import jax

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with_ntloss = not args.no_ntloss and ntloss_available()
    threads = args.threads or cpus

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    print("## NTL overhead: forward+backward (gradient w.r.t. logits), jitted\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"- machine: {cpu_model()}, nproc {os.cpu_count()}, usable CPUs {cpus}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"- jax {jax.__version__} on {jax.devices()[0].platform} "
          f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
    if with_ntloss:
        import ntloss
        import torch

        torch.set_num_threads(threads)
        print(f"- torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
              f"ntloss {getattr(ntloss, '__version__', '0.3.2')}")
    else:
        print("- torch + ntloss comparison: skipped" + (" (--no-ntloss)" if args.no_ntloss else " (not installed)"))
    if with_ntloss:
        print(f"- torch + ntloss run for: {', '.join(ntloss_dtypes) or 'none'}")
    print(f"- objective: CE (sum) + {NTL_WEIGHT} x NTL (sum); {int(DIGIT_SHARE * 100)}% of targets are digits; "
          "time / CE and torch / ntl_jax are medians of per-round ratios; every round runs all "
          "variants once in a fresh random order")
    print("- peak mem: XLA compiled memory analysis (arguments + outputs + temporaries)\n")
    sys.stdout.flush()

    for shape in shapes:
        for dtype_name in dtypes:
            repeats = 3 if args.quick and args.repeats is None else args.repeats
            log(f"logits {list(shape)} {dtype_name}")
            runners, peaks, repeats = measure_config(
                shape, dtype_name, repeats, with_ntloss and dtype_name in ntloss_dtypes, log, args.budget)
            print(format_table(shape, dtype_name, runners, peaks, repeats) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
