"""The loss head's value and gradients: fused CE + NTL vs unfused vs optax CE.

For each shape `BATCHxLENGTHxVOCAB` and dtype, three functions of `(hidden, kernel)`
are compiled with their gradients:

- `optax CE`: `hidden @ kernel`, then `optax.softmax_cross_entropy_with_integer_labels`
  (cross-entropy alone, the floor a plain LM head pays);
- `unfused`: `hidden @ kernel`, then `ntl_jax.cross_entropy_and_ntl` (NTL-WAS, λ 0.3,
  z-loss 1e-4, T5X's NUM_REAL_TARGET_TOKENS);
- `fused`: `ntl_jax.fused_cross_entropy_and_ntl` with the same options;
- `token chunks 512`: the plain alternative, `cross_entropy_and_ntl` on 512 tokens at a
  time under `jax.checkpoint` (for comparison; it cannot do the number-level loss).

Memory is XLA's compiled memory analysis (peak temporaries, nothing is run, so any
shape fits). Time runs the compiled functions round-robin (machine load hits all alike)
and reports the median over rounds of each one's time and its ratio to `unfused`.

    python benchmarks/fused_loss.py --memory-only     # the issue's shapes, compile only
    python benchmarks/fused_loss.py --shapes 1x1024x32128 1x2048x32128 --d-model 256 --rounds 7
    python benchmarks/fused_loss.py --memory-only --shapes 1x4096x128256 --chunk-sizes 512 1024 4096 8192
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntl_jax import NumberTokens, cross_entropy_and_ntl, fused_cross_entropy_and_ntl

OPTIONS = dict(ntl_kind="was", ntl_weight=0.3, z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")


def number_tokens(vocab: int) -> NumberTokens:
    """A vocabulary of `vocab` pieces whose ids 3..12 are the digits."""
    return NumberTokens.from_pieces(["<pad>", "</s>", "<unk>"] + [str(d) for d in range(10)]
                                    + [f"w{i}" for i in range(vocab - 13)])


def variants(targets, nt, chunk_sizes=()):
    def optax_ce(h, k):
        logits = jnp.einsum("bld,dv->blv", h, k)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, nt, **OPTIONS)[0]

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, nt, **OPTIONS)[0]

    def token_chunks(h, k, chunk=512):
        # The plain alternative: the logits of `chunk` tokens at a time under
        # `jax.checkpoint` (per-position variants only: numbers must not cross chunks).
        batch, length, d_model = h.shape
        n = batch * length // chunk

        @jax.checkpoint
        def one(args):
            hc, tc = args
            loss, parts = cross_entropy_and_ntl((hc @ k)[None], tc[None], nt, ntl_kind="was", ntl_weight=0.3,
                                                z_loss=1e-4)
            return loss, parts["weight_sum"]

        losses, counts = jax.lax.map(one, (h.reshape(n, chunk, d_model), targets.reshape(n, chunk)))
        return jnp.sum(losses) / jnp.maximum(jnp.sum(counts), 1.0)

    out = {"optax CE": optax_ce, "unfused": unfused, "fused": fused}
    if targets.size % 512 == 0:
        out["token chunks 512"] = token_chunks
    for chunk in chunk_sizes:
        out[f"fused c={chunk}"] = lambda h, k, chunk=chunk: fused_cross_entropy_and_ntl(
            h, k, targets, nt, chunk_size=chunk, **OPTIONS)[0]
    return out


def parse_shape(text: str) -> tuple[int, int, int]:
    batch, length, vocab = (int(x) for x in text.lower().split("x"))
    return batch, length, vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["8x2048x32128", "4x4096x128256", "1x4096x128256"],
                   help="BATCHxLENGTHxVOCAB (default: %(default)s)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--memory-only", action="store_true", help="compile only: no timing")
    p.add_argument("--chunk-sizes", type=int, nargs="*", default=[],
                   help="also the fused function at these vocabulary chunk sizes (default: its own choice only)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default="", help="also write the results as JSON here")
    args = p.parse_args()

    device = jax.devices()[0]
    print(f"# d_model {args.d_model}; jax {jax.__version__} on {device.platform} ({device.device_kind}, "
          f"{platform.processor() or platform.machine()})")
    rows = []
    for shape in args.shapes:
        batch, length, vocab = parse_shape(shape)
        nt = number_tokens(vocab)
        rng = np.random.default_rng(0)
        targets = jnp.asarray(rng.integers(0, vocab, size=(batch, length)), jnp.int32)
        for dtype_name in args.dtypes:
            dtype = jnp.dtype(dtype_name)
            specs = (jax.ShapeDtypeStruct((batch, length, args.d_model), dtype),
                     jax.ShapeDtypeStruct((args.d_model, vocab), dtype))
            compiled, temp = {}, {}
            for name, f in variants(targets, nt, args.chunk_sizes).items():
                compiled[name] = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*specs).compile()
                temp[name] = compiled[name].memory_analysis().temp_size_in_bytes
            times = {name: [] for name in compiled}
            if not args.memory_only:
                hidden = jnp.asarray(rng.normal(size=specs[0].shape), dtype)
                kernel = jnp.asarray(rng.normal(size=specs[1].shape) / np.sqrt(args.d_model), dtype)
                for c in compiled.values():
                    jax.block_until_ready(c(hidden, kernel))
                for _ in range(args.rounds):
                    for name, c in compiled.items():
                        start = time.perf_counter()
                        jax.block_until_ready(c(hidden, kernel))
                        times[name].append(time.perf_counter() - start)
            for name in compiled:
                row = {"shape": shape, "dtype": dtype_name, "variant": name, "temp_bytes": temp[name],
                       "memory_vs_unfused": temp["unfused"] / max(temp[name], 1)}
                if times[name]:
                    row["median_seconds"] = statistics.median(times[name])
                    row["time_vs_unfused"] = statistics.median(
                        t / u for t, u in zip(times[name], times["unfused"]))
                rows.append(row)
                timing = ""
                if "median_seconds" in row:
                    timing = f"  {row['median_seconds'] * 1e3:9.1f} ms  time {row['time_vs_unfused']:.2f}x unfused"
                print(f"{shape:>15s} {dtype_name:8s} {name:16s} temporaries {temp[name] / 2**20:9.1f} MiB "
                      f"({row['memory_vs_unfused']:6.1f}x less than unfused){timing}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"d_model": args.d_model, "jax": jax.__version__, "device": device.device_kind,
                       "rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
