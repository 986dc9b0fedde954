"""The loss head's value and gradients: fused CE + NTL vs unfused vs optax CE.

For each shape `BATCHxLENGTHxVOCAB` and dtype, three functions of `(hidden, kernel)`
are compiled with their gradients:

- `optax CE`: `hidden @ kernel`, then `optax.softmax_cross_entropy_with_integer_labels`
  (cross-entropy alone, the floor a plain LM head pays);
- `unfused`: `hidden @ kernel`, then `ntl_jax.cross_entropy_and_ntl` (NTL-WAS, λ 0.3,
  z-loss 1e-4, T5X's NUM_REAL_TARGET_TOKENS);
- `fused`: `ntl_jax.fused_cross_entropy_and_ntl` with the same options;
- `fused CE`: the same with `number_loss=None` (what NTL adds to the fused head);
- `token chunks 512`: the plain alternative, `cross_entropy_and_ntl` on 512 tokens at a
  time under `jax.checkpoint` (for comparison; it cannot do the number-level loss).

Memory is XLA's compiled memory analysis (peak temporaries, nothing is run, so any
shape fits). Time runs the compiled functions once per round in a fresh random order
(machine load hits all alike) and reports the median over rounds of each one's time and
of its per-round ratios to `unfused` and to `fused CE`. Every row also gives the largest
array in the optimised HLO and how many of its instructions have a `[B, L, V]` or
`[B*L, V]` shape: 0 for the fused variants says the logits are never formed, not even
inside a fusion (pick `d_model` != B*L, or the kernel's gradient counts as one).

`--vocab llama3` uses the LLaMA-3-like table of `vocabularies.py` (1,110 number pieces
at scattered ids, half the targets number tokens) instead of T5's ten digits.

    python benchmarks/fused_loss.py --memory-only     # the issue's shapes, compile only
    python benchmarks/fused_loss.py --shapes 1x1024x32128 1x2048x32128 --d-model 256 --rounds 7
    python benchmarks/fused_loss.py --memory-only --shapes 1x4096x128256 --chunk-sizes 512 1024 4096 8192
    python benchmarks/fused_loss.py --sharded --out results/fused_loss_sharded_cpu.json
    python benchmarks/fused_loss.py --vocab llama3 --shapes 4x128x128256 --d-model 256 --rounds 7

`--sharded` compiles (does not run) the fused function on 8 host CPU devices, a mesh of
8/n `data` x n `model` for n = 1, 2, 4, 8 vocabulary shards, hidden on `data` and the
kernel's columns on `model`, and reports per-device temporaries and the elements moved
by all-gathers, left to XLA's partitioner (`vocab_axis=None`) and vocabulary-parallel
(`vocab_axis="model"`), against the one-device compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time

if "--sharded" in sys.argv:  # the device count is fixed when JAX starts
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
import optax
from vocabularies import VOCABS, llama3_number_tokens, sample_targets

from ntl_jax import NumberTokens, cross_entropy_and_ntl, fused_cross_entropy_and_ntl
from ntl_jax.train.machine import cpu_model

OPTIONS = dict(number_loss="was", ntl_weight=0.3, z_loss=1e-4, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS")


def number_tokens(vocab: int, kind: str = "t5") -> NumberTokens:
    """T5: a vocabulary of `vocab` pieces whose ids 3..12 are the digits; llama3: the
    LLaMA-3-like table (`vocabularies.py`)."""
    if kind == "llama3":
        return llama3_number_tokens(vocab)
    return NumberTokens.from_pieces(["<pad>", "</s>", "<unk>"] + [str(d) for d in range(10)]
                                    + [f"w{i}" for i in range(vocab - 13)])


def make_targets(rng, batch, length, nt: NumberTokens, kind: str):
    """T5: uniform over the vocabulary (as before); llama3: half number tokens."""
    vocab = nt.vocab_size
    if kind == "t5":
        return jnp.asarray(rng.integers(0, vocab, size=(batch, length)), jnp.int32)
    ids = np.asarray(nt.ids)
    return jnp.asarray(sample_targets(rng, (batch, length), ids, np.setdiff1d(np.arange(vocab), ids), 0.5),
                       jnp.int32)


_HLO_SHAPE = re.compile(r"\b(?:pred|[suf](?:8|16|32|64)|bf16)\[([\d,]+)\]")


def hlo_arrays(hlo_text: str, batch: int, length: int, vocab: int) -> dict:
    """The largest array shape in an optimised HLO module and how many instruction
    shapes are the logits' (`[B, L, V]` or `[B*L, V]`, in any order)."""
    shapes = [tuple(int(x) for x in dims.split(",")) for dims in _HLO_SHAPE.findall(hlo_text)]
    logits_shapes = {tuple(sorted((batch, length, vocab))), tuple(sorted((batch * length, vocab)))}
    largest = max(shapes, key=math.prod, default=())
    return {"largest_array": list(largest), "largest_array_elements": math.prod(largest),
            "logits_shaped_arrays": sum(tuple(sorted(s)) in logits_shapes for s in shapes)}


def variants(targets, nt, chunk_sizes=()):
    def optax_ce(h, k):
        logits = jnp.einsum("bld,dv->blv", h, k)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

    def unfused(h, k):
        return cross_entropy_and_ntl(jnp.einsum("bld,dv->blv", h, k), targets, nt, **OPTIONS)[0]

    def fused(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, nt, **OPTIONS)[0]

    def fused_ce(h, k):
        return fused_cross_entropy_and_ntl(h, k, targets, nt, **{**OPTIONS, "number_loss": None})[0]

    def token_chunks(h, k, chunk=512):
        # The plain alternative: the logits of `chunk` tokens at a time under
        # `jax.checkpoint` (per-position variants only: numbers must not cross chunks).
        batch, length, d_model = h.shape
        n = batch * length // chunk

        @jax.checkpoint
        def one(args):
            hc, tc = args
            loss, parts = cross_entropy_and_ntl((hc @ k)[None], tc[None], nt, number_loss="was", ntl_weight=0.3,
                                                z_loss=1e-4)
            return loss, parts["weight_sum"]

        losses, counts = jax.lax.map(one, (h.reshape(n, chunk, d_model), targets.reshape(n, chunk)))
        return jnp.sum(losses) / jnp.maximum(jnp.sum(counts), 1.0)

    out = {"optax CE": optax_ce, "unfused": unfused, "fused": fused, "fused CE": fused_ce}
    if targets.size % 512 == 0:
        out["token chunks 512"] = token_chunks
    for chunk in chunk_sizes:
        out[f"fused c={chunk}"] = lambda h, k, chunk=chunk: fused_cross_entropy_and_ntl(
            h, k, targets, nt, chunk_size=chunk, **OPTIONS)[0]
    return out


def sharded_rows(shape: str, d_model: int, dtype_name: str, vocab_kind: str = "t5") -> list[dict]:
    """Per-device temporaries and all-gathered elements of the fused function's value
    and gradients on 8/n data x n model meshes (compiled, not run)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    batch, length, vocab = parse_shape(shape)
    nt = number_tokens(vocab, vocab_kind)
    targets = jnp.zeros((batch, length), jnp.int32)
    dtype = jnp.dtype(dtype_name)

    def compile_on(mesh, vocab_axis):
        def loss(h, k):
            return fused_cross_entropy_and_ntl(h, k, targets, nt, vocab_axis=vocab_axis,
                                               mesh=mesh if vocab_axis else None, **OPTIONS)[0]

        specs = [jax.ShapeDtypeStruct((batch, length, d_model), dtype), jax.ShapeDtypeStruct((d_model, vocab), dtype)]
        if mesh is not None:
            specs = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))
                     for s, spec in zip(specs, (P("data"), P(None, "model")))]
        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*specs).compile()
        # The output shapes of the all-gathers: what each one moves onto a device.
        shapes = [[int(x) for x in dims.split(",") if x]
                  for dims in re.findall(r"= \w+\[([\d,]*)\][^=\n]*? all-gather(?:-start)?\(", compiled.as_text())]
        return {"temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                "gathered_elements": sum(math.prod(s) for s in shapes),
                "gathered_with_d_model": sum(math.prod(s) for s in shapes if d_model in s)}

    one = compile_on(None, None)
    rows = [{"shape": shape, "dtype": dtype_name, "layout": "one device", "vocab_shards": 1, "data_shards": 1, **one}]
    devices = np.array(jax.devices()[:8])
    for shards in (1, 2, 4, 8):
        mesh = Mesh(devices.reshape(8 // shards, shards), ("data", "model"))
        for layout, axis in (("XLA partitioner", None), ("vocab-parallel", "model")):
            row = compile_on(mesh, axis)
            row["temp_vs_one_device"] = row["temp_bytes"] / one["temp_bytes"]
            rows.append({"shape": shape, "dtype": dtype_name, "layout": layout, "vocab_shards": shards,
                         "data_shards": 8 // shards, **row})
    return rows


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
    p.add_argument("--sharded", action="store_true",
                   help="per-device memory and all-gathers on 8 host devices, 1/2/4/8 vocabulary shards "
                        "(default shape 8x1024x128256, bfloat16)")
    p.add_argument("--vocab", choices=VOCABS, default="t5",
                   help="number-token table: t5 (default: the digits 0-9) or llama3 (1,110 number pieces "
                        "0-999, 00-09, 000-099 at scattered ids; needs V >= 4096)")
    p.add_argument("--seed", type=int, default=0, help="seed of the targets and of the round order")
    p.add_argument("--out", default="", help="also write the results as JSON here")
    args = p.parse_args()
    command = " ".join(["python", "benchmarks/fused_loss.py", *sys.argv[1:]])

    if args.sharded:
        shapes = args.shapes if args.shapes != p.get_default("shapes") else ["8x1024x128256"]
        dtypes = args.dtypes if args.dtypes != p.get_default("dtypes") else ["bfloat16"]
        rows = []
        print(f"# d_model {args.d_model}; jax {jax.__version__}, {jax.device_count()} host devices; compiled, not run")
        for shape in shapes:
            for dtype_name in dtypes:
                for row in sharded_rows(shape, args.d_model, dtype_name, args.vocab):
                    rows.append(row)
                    print(f"{shape:>15s} {dtype_name:8s} {row['layout']:16s} data {row['data_shards']} x vocab "
                          f"{row['vocab_shards']}: temporaries per device {row['temp_bytes'] / 2**20:7.1f} MiB, "
                          f"all-gathered {row['gathered_elements']:>11,d} elements "
                          f"({row['gathered_with_d_model']:,d} with d_model)", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"d_model": args.d_model, "jax": jax.__version__, "devices": jax.device_count(),
                           "vocab": args.vocab, "command": command, "options": OPTIONS, "rows": rows}, f, indent=1)
        return

    device = jax.devices()[0]
    print(f"# d_model {args.d_model}; jax {jax.__version__} on {device.platform} ({device.device_kind}, "
          f"{cpu_model()})")
    rows = []
    load_start = os.getloadavg()[0]
    order_rng = np.random.default_rng(args.seed + 1)
    for shape in args.shapes:
        batch, length, vocab = parse_shape(shape)
        nt = number_tokens(vocab, args.vocab)
        rng = np.random.default_rng(args.seed)
        targets = make_targets(rng, batch, length, nt, args.vocab)
        for dtype_name in args.dtypes:
            dtype = jnp.dtype(dtype_name)
            specs = (jax.ShapeDtypeStruct((batch, length, args.d_model), dtype),
                     jax.ShapeDtypeStruct((args.d_model, vocab), dtype))
            compiled, temp, arrays = {}, {}, {}
            for name, f in variants(targets, nt, args.chunk_sizes).items():
                compiled[name] = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*specs).compile()
                temp[name] = compiled[name].memory_analysis().temp_size_in_bytes
                arrays[name] = hlo_arrays(compiled[name].as_text(), batch, length, vocab)
            times = {name: [] for name in compiled}
            if not args.memory_only:
                hidden = jnp.asarray(rng.normal(size=specs[0].shape), dtype)
                kernel = jnp.asarray(rng.normal(size=specs[1].shape) / np.sqrt(args.d_model), dtype)
                for c in compiled.values():
                    jax.block_until_ready(c(hidden, kernel))
                names = list(compiled)
                for _ in range(args.rounds):
                    # A fresh random order every round: no variant always runs after the same one.
                    for name in order_rng.permutation(names):
                        start = time.perf_counter()
                        jax.block_until_ready(compiled[name](hidden, kernel))
                        times[name].append(time.perf_counter() - start)
            for name in compiled:
                row = {"shape": shape, "dtype": dtype_name, "variant": name, "temp_bytes": temp[name],
                       "memory_vs_unfused": temp["unfused"] / max(temp[name], 1),
                       "temp_vs_fused_ce": temp[name] / max(temp["fused CE"], 1), **arrays[name]}
                if times[name]:
                    row["median_seconds"] = statistics.median(times[name])
                    row["seconds_min_max"] = [min(times[name]), max(times[name])]
                    for ref, key in (("unfused", "time_vs_unfused"), ("fused CE", "time_vs_fused_ce")):
                        ratios = [t / u for t, u in zip(times[name], times[ref])]
                        row[key] = statistics.median(ratios)
                        row[key + "_min_max"] = [min(ratios), max(ratios)]
                rows.append(row)
                timing = ""
                if "median_seconds" in row:
                    timing = (f"  {row['median_seconds'] * 1e3:9.1f} ms  time {row['time_vs_unfused']:.2f}x unfused, "
                              f"{row['time_vs_fused_ce']:.3f}x fused CE")
                print(f"{shape:>15s} {dtype_name:8s} {name:16s} temporaries {temp[name] / 2**20:9.1f} MiB "
                      f"({row['memory_vs_unfused']:6.1f}x less than unfused), {row['logits_shaped_arrays']} "
                      f"[B, L, V]-shaped HLO arrays{timing}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"d_model": args.d_model, "jax": jax.__version__, "device": device.device_kind,
                       "vocab": args.vocab, "command": command, "date": datetime.datetime.now().isoformat(
                           timespec="seconds"), "load_average": [load_start, os.getloadavg()[0]],
                       "rounds": args.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
