"""Train-step time with NTL vs cross-entropy only, on the trainer's network.

All variants run interleaved in one process, in a fresh random order every round, so
machine load affects them alike; each round times `--steps` jitted steps per variant
after compilation. Prints the median time per step and the median over rounds of each
variant's ratio to the first one, with a distribution-free 95% interval for that median
(order statistics, from 6 rounds). The first variant is also compiled and timed a
second time, `<first> (again)`: the same program, so its ratio is the machine's noise.

    python benchmarks/train_step.py                 # tiny preset, the `compare` shapes
    python benchmarks/train_step.py --preset micro --rounds 3 --steps 5   # smoke run
    python benchmarks/train_step.py --losses ntl-was --fused both   # fused vs unfused loss
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from loss_overhead import median_interval

from ntl_jax.train import network, optim
from ntl_jax.train import step as step_lib
from ntl_jax.train.machine import cpu_model
from ntl_jax.train.trainer import number_tokens_of


def synthetic_batch(rng: np.random.Generator, vocabulary, batch: int, lin: int, ltgt: int):
    """Random question tokens and digit answers of realistic length, as features."""
    from ntl_jax.train.data import EOS_ID, to_features

    digit_ids = [vocabulary.encode(str(d))[-1] for d in range(10)]
    inputs = rng.integers(3, int(vocabulary.vocab_size), size=(batch, lin)).astype(np.int32)
    inputs[:, -1] = EOS_ID
    targets = np.zeros((batch, ltgt), np.int32)
    for row in targets:
        n = int(rng.integers(1, ltgt))
        row[:n] = rng.choice(digit_ids, size=n)
        row[n] = EOS_ID
    return to_features(inputs, targets)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=sorted(network.PRESETS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-length", type=int, default=32)
    p.add_argument("--target-length", type=int, default=24)
    p.add_argument("--losses", nargs="+", default=["ce", "ntl-was", "ntl-mse"])
    p.add_argument("--fused", choices=("off", "on", "both"), default="off",
                   help="the loss from hidden states (--fused-loss), without it, or each loss both ways")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    args = p.parse_args()

    from ntl_jax.data.vocabulary import default_vocabulary

    vocabulary = default_vocabulary()
    cfg = network.make_config(args.preset, int(vocabulary.vocab_size))
    model = network.Transformer(cfg)
    number_tokens = number_tokens_of(vocabulary)
    optimizer = optim.make_optimizer("adamw", learning_rate=1e-3, total_steps=10_000)
    batch = synthetic_batch(np.random.default_rng(0), vocabulary, args.batch,
                            args.input_length, args.target_length)
    batch = jax.device_put(batch)
    fused = {"off": [False], "on": [True], "both": [False, True]}[args.fused]
    variants = [(loss + (" fused" if f else ""), loss, f) for loss in args.losses for f in fused]
    variants.insert(1, (variants[0][0] + " (again)",) + variants[0][1:])
    steps, states = {}, {}
    for name, loss, f in variants:
        steps[name] = step_lib.make_train_step(model, optimizer, number_tokens, loss=loss, fused_loss=f)
        states[name] = step_lib.create_train_state(model, optimizer, batch, seed=0)
        for _ in range(2):  # compile and warm up
            states[name], m = steps[name](states[name], batch)
        jax.block_until_ready(m)
    names = list(steps)

    times = {name: [] for name in names}
    order = np.random.default_rng(1)
    for _ in range(args.rounds):
        for name in order.permutation(names):
            state = states[name]
            t = time.perf_counter()
            for _ in range(args.steps):
                state, m = steps[name](state, batch)
            jax.block_until_ready((state, m))
            times[name].append((time.perf_counter() - t) / args.steps)
            states[name] = state

    print(f"# {args.preset} preset, batch {args.batch}, lengths {args.input_length}/"
          f"{args.target_length}, vocab {cfg.vocab_size}; {args.rounds} rounds x "
          f"{args.steps} steps; jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({cpu_model()})")
    base = times[names[0]]
    for name in names:
        ratios = [t / b for t, b in zip(times[name], base)]
        interval = median_interval(ratios)
        spread = "" if interval is None else f"  95% interval {interval[0]:.3f}-{interval[1]:.3f}"
        print(f"{name:24s} median {1e3 * statistics.median(times[name]):8.2f} ms/step   "
              f"ratio to {names[0]}: {statistics.median(ratios):.3f}x{spread}")


if __name__ == "__main__":
    main()
