"""Memory of a Tunix train step's loss and gradients at Qwen's vocabulary (151,936): CE +
NTL from the logits against fused from the final hidden states (`ntl_jax.tunix`).

A Qwen2 model with Qwen2.5-0.5B's width and tied head (d_model 896, 14 heads of 64, 2
key-value heads, MLP 4,864, vocabulary 151,936), fewer layers (`--layers`, the head's
cost does not depend on them), float32 as Tunix's config defaults to. The step is
`nnx.value_and_grad` of `ntl_jax.tunix.number_token_loss_fn` (NTL-WAS, λ 0.3) over all
parameters, compiled (never run) for:

- `cpu`: one host CPU device, and per device on Tunix's `("fsdp", "tp")` mesh of 8 host
  devices (`--mesh`, default 4x2), the parameters placed by their own sharding
  annotations and the batch over `fsdp`;
- `tpu`: one TPU v5e chip and the same mesh on `v5e:2x4`, ahead of time (libtpu, no TPU).

`peak` is XLA's compiled memory analysis per device: arguments + outputs + temporaries
- aliased bytes. The batch is `--batch` sequences of `--length` tokens per `fsdp` shard.

    python benchmarks/tunix_memory.py --out benchmarks/results/tunix_memory_qwen.json
    python benchmarks/tunix_memory.py --layers 1 --length 128 --platforms cpu   # quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.qwen2 import model as qwen2  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpu_cost import tpu_devices  # noqa: E402

import ntl_jax  # noqa: E402
from ntl_jax import tunix as ntl_tunix  # noqa: E402

QWEN_VOCAB = 151_936


def qwen_config(layers: int) -> qwen2.ModelConfig:
    return qwen2.ModelConfig(num_layers=layers, vocab_size=QWEN_VOCAB, embed_dim=896, hidden_dim=4864, num_heads=14,
                             head_dim=64, num_kv_heads=2, rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=True)


def number_tokens() -> ntl_jax.NumberTokens:
    # Qwen's digits are ten single-character tokens; where they sit does not change the memory.
    pieces = [f"w{i}" for i in range(QWEN_VOCAB)]
    for digit in range(10):
        pieces[15 + digit] = str(digit)  # as in Qwen2's vocabulary: "0" is id 15
    return ntl_jax.NumberTokens.from_pieces(pieces)


def step_fn(graphdef, fused: bool, numbers):
    loss_fn = ntl_tunix.number_token_loss_fn(numbers, ntl_weight=0.3, fused=fused)

    def step(state, inputs):
        model = nnx.merge(graphdef, state)
        (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, **inputs)
        return loss, nnx.state(grads)

    return step


def abstract_inputs(batch: int, length: int, sharding) -> dict:
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return {"input_tokens": spec((batch, length), jnp.int32), "input_mask": spec((batch, length), jnp.bool_),
            "positions": spec((batch, length), jnp.int32), "attention_mask": spec((batch, length, length), jnp.bool_)}


def compile_peak(config, devices, mesh_shape, batch: int, length: int, fused: bool, numbers) -> dict:
    abstract = nnx.eval_shape(lambda: qwen2.Qwen2(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    if mesh_shape is None:
        one = jax.sharding.SingleDeviceSharding(devices[0])
        state = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), state)
        inputs = abstract_inputs(batch, length, one)
        context = None
    else:
        mesh = jax.sharding.Mesh(np.asarray(devices[:math.prod(mesh_shape)], dtype=object).reshape(mesh_shape),
                                 ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        shardings = nnx.get_named_sharding(state, mesh)
        state = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                                       shardings)
        data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
        inputs = abstract_inputs(batch * mesh_shape[0], length, data)
        context = mesh
    step = step_fn(graphdef, fused, numbers)
    if context is None:
        compiled = jax.jit(step).lower(state, inputs).compile()
    else:
        with context:
            compiled = jax.jit(step).lower(state, inputs).compile()
    mem = compiled.memory_analysis()
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    return {"peak_bytes": int(peak), "temp_bytes": int(mem.temp_size_in_bytes),
            "argument_bytes": int(mem.argument_size_in_bytes)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="sequences per fsdp shard")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--mesh", default="4x2", help="fsdp x tp")
    parser.add_argument("--platforms", nargs="+", default=["cpu", "tpu"], choices=["cpu", "tpu"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    mesh_shape = tuple(int(n) for n in args.mesh.split("x"))
    config, numbers = qwen_config(args.layers), number_tokens()
    rows = []
    for name in args.platforms:
        devices = jax.devices("cpu") if name == "cpu" else tpu_devices("v5e:2x4")
        for layout in (None, mesh_shape):
            for fused in (False, True):
                row = {"platform": name, "layout": "one device" if layout is None else f"mesh {args.mesh}",
                       "path": "fused" if fused else "logits",
                       **compile_peak(config, devices, layout, args.batch, args.length, fused, numbers)}
                rows.append(row)
                print(f"{name:4} {row['layout']:10} {row['path']:6} peak {row['peak_bytes'] / 2**30:7.2f} GiB "
                      f"(temporaries {row['temp_bytes'] / 2**30:.2f} GiB)", flush=True)
    for name in args.platforms:
        for layout in ("one device", f"mesh {args.mesh}"):
            pair = {r["path"]: r for r in rows if r["platform"] == name and r["layout"] == layout}
            ratio = pair["fused"]["peak_bytes"] / pair["logits"]["peak_bytes"]
            print(f"{name} {layout}: fused peak / logits peak = {ratio:.3f}")
    if args.out:
        result = {"command": "python benchmarks/tunix_memory.py " + " ".join(argv or sys.argv[1:]),
                  "date": datetime.date.today().isoformat(), "jax": jax.__version__, "machine": platform.machine(),
                  "model": {"layers": args.layers, "d_model": 896, "vocab": QWEN_VOCAB, "tied": True,
                            "dtype": "float32"},
                  "batch_per_fsdp_shard": args.batch, "length": args.length, "mesh": args.mesh, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
