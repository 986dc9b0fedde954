"""Time of a whole train step with NTL against the CE step, on the device JAX runs on.

The step is the one `tpu_cost.py` compiles for a TPU v5e and reads the bytes of (its
section 5): a GPT-2-small-like decoder (12 layers, d 768, 12 heads, bf16, the softmax in
float32, tied embedding, remat per layer), T5's 32,128-piece vocabulary with the digits
as number tokens, AdamW, parameters and optimizer state donated; its losses are optax's
CE, optax's CE + 0.3 x `ntl_was`, and `cross_entropy_and_ntl`. Here each is timed with
`loss_overhead.py`'s interleaved rounds: after an untimed round that compiles them, every
round runs `--steps` steps of each variant in a fresh random order, and each row gives
the median time per step and the median over rounds of its ratio to optax CE's step in
the same round, with a distribution-free 95% interval.
`optax CE (again)` is the reference compiled and timed a second time: its ratio is the
machine's noise.

    python benchmarks/train_step_gpt.py --out benchmarks/results/train_step_gpt_h200.json   # on a GPU
    python benchmarks/train_step_gpt.py --layers 1 --batch 1 --length 64 --rounds 2 --steps 1   # a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import numpy as np
import tpu_cost
from loss_overhead import MASKED_SHARE, Runner, interleave, median_ratio, ratio_interval
from vocabularies import sample_targets

NUMBER_SHARE = 0.5  # of the targets, as in the other benchmarks


def build_parser() -> argparse.ArgumentParser:
    gpt = tpu_cost.GPT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=gpt["layers"])
    parser.add_argument("--batch", type=int, default=gpt["batch"])
    parser.add_argument("--length", type=int, default=gpt["length"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    parser.add_argument("--out", default=None, metavar="FILE.json")
    return parser


def stepper(step, params, optimizer, batch, steps):
    """A call that runs `steps` train steps from its own copy of the parameters and
    optimizer state (donated, then replaced by the step's) and waits for the last."""
    import jax
    import jax.numpy as jnp

    step = jax.jit(step, donate_argnums=(0, 1))
    state = [jax.tree.map(jnp.copy, params), optimizer.init(params)]

    def call():
        for _ in range(steps):
            new_params, new_opt_state, loss = step(*state, *batch)
            state[:] = new_params, new_opt_state
        return jax.block_until_ready((state, loss))

    return call


def run(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("layers", "batch", "length", "rounds", "steps"):
        if getattr(args, name) < 1:
            print(f"error: expected --{name} >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2

    import jax
    import jax.numpy as jnp
    import optax

    gpt = tpu_cost.GPT
    optimizer = optax.adamw(1e-4, weight_decay=0.1)
    params = tpu_cost.gpt_init(jax.random.key(0), layers=args.layers, d=gpt["d_model"], vocab=gpt["vocab"],
                               length=args.length)
    rng = np.random.default_rng(0)
    ids = np.asarray(tpu_cost.number_tokens("t5").ids)
    others = np.setdiff1d(np.arange(gpt["vocab"]), ids)
    shape = (args.batch, args.length)
    batch = (jnp.asarray(rng.integers(0, gpt["vocab"], shape), jnp.int32),
             jnp.asarray(sample_targets(rng, shape, ids, others, NUMBER_SHARE), jnp.int32),
             jnp.asarray(rng.uniform(size=shape) >= MASKED_SHARE, jnp.float32))

    losses = tpu_cost.train_step_losses()
    reference = next(iter(losses))
    losses = {reference: losses[reference], f"{reference} (again)": losses[reference],
              **{k: v for k, v in losses.items() if k != reference}}
    runners = {name: Runner(name, stepper(tpu_cost.train_step(loss, optimizer), params, optimizer, batch, args.steps),
                            args.steps) for name, loss in losses.items()}
    # The first round (untimed, `interleave`'s warm-up) compiles each step.
    interleave(runners, args.rounds, None, lambda message: print(message, file=sys.stderr))
    failed = {name: runner.error for name, runner in runners.items() if runner.error}
    if failed:
        print(f"error: steps failed: {failed}", file=sys.stderr)
        return 1

    device = jax.devices()[0]
    rows = [{"variant": name, "median_ms": 1e3 * statistics.median(runner.times),
             "time_ratio": median_ratio(runner, runners[reference]),
             "time_ratio_ci95": ratio_interval(runner, runners[reference])} for name, runner in runners.items()]
    print(f"## Train step, {args.layers} layers, batch {args.batch} x {args.length}, vocabulary {gpt['vocab']}: "
          f"{args.rounds} rounds x {args.steps} steps; jax {jax.__version__} on {device.platform} "
          f"({device.device_kind})\n")
    print(f"| loss | ms / step | time / {reference} | 95% interval |\n|---|---:|---:|---:|")
    for row in rows:
        interval = row["time_ratio_ci95"]
        cells = "—" if interval is None else f"{interval[0]:.3f}–{interval[1]:.3f}"
        print(f"| {row['variant']} | {row['median_ms']:.2f} | {row['time_ratio']:.3f} | {cells} |")
    if args.out:
        payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "jax": jax.__version__,
                   "device": device.platform, "device_kind": device.device_kind,
                   "command": " ".join(["python", "benchmarks/train_step_gpt.py", *(argv or sys.argv[1:])]),
                   "layers": args.layers, "batch": args.batch, "length": args.length, "vocab": gpt["vocab"],
                   "rounds": args.rounds, "steps": args.steps, "ntl_weight": tpu_cost.NTL_WEIGHT, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(run())
