"""Per-device memory of a KerasHub train step on a TPU v5e pod slice, compiled ahead of
time (libtpu, no TPU needed): `ntl_jax.keras.NumberTokenLoss` and
`FusedNumberTokenLossModel` against Keras's own
`SparseCategoricalCrossentropy(from_logits=True)`.

The model is a KerasHub `GemmaCausalLM` built from config on the CPU (random weights,
nothing downloaded) with Gemma 2B's width and head: vocabulary 256,000, hidden 2,048,
8 query heads of 256, one key-value head, MLP 16,384, the embedding tied to the head,
bfloat16 weights (`dtype="bfloat16"`), and fewer decoder layers (`--layers`, 2 by
default; the loss touches only the head, which keeps its full size). Two fine-tunings:
`lora` (`backbone.enable_lora(4)`, KerasHub's query and value projections) and `full`
(every weight), both with `AdamW`.

The step is Keras's own: `model.train_step(state, (x, y, sample_weight))` with `state =
(trainable, non-trainable, optimizer, metrics variables)`, jitted as Keras's JAX trainer
does (`donate_argnums=0`, the state's shardings as its output shardings) and compiled
for `v5e:2x4` on a 2 x 4 `("batch", "model")` mesh. The weights are placed by KerasHub's
own layout map (`GemmaBackbone.get_layout_map`: the embedding, so the vocabulary, over
"model"; a dimension that does not divide over its mesh axis, the single key-value
head's, stays whole), each optimizer slot as its weight, the batch over "batch".

Rows: `keras_scce` (KerasHub's default loss), `ntl` (`NumberTokenLoss`, NTL-WAS, λ 0.3,
Gemma's ten digits) and `fused` (`FusedNumberTokenLossModel` with the same loss, its head
traced for the v5e: `device_kind`). No
metrics besides Keras's loss tracker (and the fused model's `ntl`). `per_device_bytes`
is XLA's memory analysis of the compiled step per device: arguments + outputs +
temporaries - aliased bytes; `bytes_accessed` its cost analysis.

    python benchmarks/keras_pod_cost.py --out benchmarks/results/keras_pod_cost.json
    python benchmarks/keras_pod_cost.py --layers 1 --length 128 --tunings lora   # quick
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the model is built on the CPU; the step compiles for the TPU
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tpu_cost import tpu_devices  # noqa: E402

import ntl_jax  # noqa: E402
import ntl_jax.keras as ntl_keras  # noqa: E402

TOPOLOGY = "v5e:2x4"
MESH_SHAPE = (2, 4)
MESH_AXES = ("batch", "model")
GEMMA_VOCAB = 256_000
# Gemma 2B's config (KerasHub's "gemma_2b_en"), all but the number of layers.
GEMMA_2B = {"vocabulary_size": GEMMA_VOCAB, "num_query_heads": 8, "num_key_value_heads": 1, "hidden_dim": 2048,
            "intermediate_dim": 32768, "head_dim": 256}
LORA_RANK = 4
NTL_WEIGHT = 0.3
LOSSES = ("keras_scce", "ntl", "fused")
TUNINGS = ("lora", "full")


def number_tokens(vocab: int) -> ntl_jax.NumberTokens:
    """Ten single-digit tokens, as `ntl_keras.number_tokens` reads Gemma's; where they
    sit in the vocabulary does not change the memory."""
    pieces = [f"w{i}" for i in range(vocab)]
    for digit in range(10):
        pieces[236 + digit] = str(digit)
    return ntl_jax.NumberTokens.from_pieces(pieces)


def build(layers: int, vocab: int):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(**{**GEMMA_2B, "vocabulary_size": vocab}, num_layers=layers,
                                              dtype="bfloat16")
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def model_for(causal_lm, loss_name: str, numbers, device_kind: str):
    """`causal_lm` (or the fused model around it, its head traced for the chip
    `device_kind`) compiled with the row's loss."""
    optimizer = keras.optimizers.AdamW(5e-5, weight_decay=0.01)
    if loss_name == "fused":
        model = ntl_keras.FusedNumberTokenLossModel(
            causal_lm, ntl_keras.NumberTokenLoss(numbers, number_loss="was", ntl_weight=NTL_WEIGHT),
            device_kind=device_kind)
        model.compile(optimizer=optimizer)
        return model
    loss = (keras.losses.SparseCategoricalCrossentropy(from_logits=True) if loss_name == "keras_scce"
            else ntl_keras.NumberTokenLoss(numbers, number_loss="was", ntl_weight=NTL_WEIGHT))
    causal_lm.compile(optimizer=optimizer, loss=loss, weighted_metrics=[])
    return causal_lm


class Placement:
    """Shardings on the TPU mesh by KerasHub's layout map, with the dimensions that do
    not divide over their axis kept whole (recorded in `kept_whole`)."""

    def __init__(self, devices):
        self.mesh = Mesh(np.asarray(devices[:8], dtype=object).reshape(MESH_SHAPE), MESH_AXES)
        keras_mesh = keras.distribution.DeviceMesh(MESH_SHAPE, MESH_AXES, devices=list(devices[:8]))
        self.layout_map = keras_hub.models.GemmaBackbone.get_layout_map(
            keras_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch")
        self.kept_whole = {}
        self.sharded = {}

    def weight(self, variable) -> NamedSharding:
        layout = self.layout_map[variable.path]
        axes = [None] * len(variable.shape) if layout is None else list(layout.axes)
        for i, (axis, size) in enumerate(zip(axes, variable.shape)):
            if axis is not None and size % self.mesh.shape[axis]:
                self.kept_whole[variable.path] = f"dim {i} ({size}) not over {axis!r} ({self.mesh.shape[axis]})"
                axes[i] = None
        if any(axes):
            self.sharded[variable.path] = str(tuple(axes))
        return NamedSharding(self.mesh, PartitionSpec(*axes))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def data(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec("batch"))


def abstract(variable, sharding):
    return jax.ShapeDtypeStruct(tuple(variable.shape), jnp.dtype(variable.dtype), sharding=sharding)


def abstract_state(model, placement: Placement):
    """Keras's JAX train state as `ShapeDtypeStruct`s, and its shardings."""
    by_weight = {id(v): placement.weight(v) for v in model.trainable_variables + model.non_trainable_variables}
    optimizer = model.optimizer
    slots = {}
    for name in ("_momentums", "_velocities", "_velocity_hats"):
        for weight, slot in zip(optimizer._trainable_variables, getattr(optimizer, name, None) or []):
            slots[id(slot)] = by_weight[id(weight)]
    groups = (
        [(v, by_weight[id(v)]) for v in model.trainable_variables],
        [(v, by_weight[id(v)]) for v in model.non_trainable_variables],
        [(v, slots.get(id(v), placement.replicated())) for v in optimizer.variables],
        [(v, placement.replicated()) for v in model.metrics_variables],
    )
    for v, sharding in groups[2]:
        if id(v) not in slots and len(v.shape):
            raise ValueError(f"optimizer variable {v.path} {v.shape} has no weight to be placed as")
    state = tuple([abstract(v, s) for v, s in group] for group in groups)
    shardings = tuple([s for _, s in group] for group in groups)
    return state, shardings


def abstract_batch(batch: int, length: int, sharding):
    def spec(dtype):
        return jax.ShapeDtypeStruct((batch, length), dtype, sharding=sharding)

    # As GemmaCausalLMPreprocessor's: token ids, the padding mask, next-token ids, the mask as weights.
    return ({"token_ids": spec(jnp.int32), "padding_mask": spec(jnp.bool_)}, spec(jnp.int32), spec(jnp.bool_))


def compile_row(causal_lm, loss_name, numbers, placement, batch, length) -> dict:
    model = model_for(causal_lm, loss_name, numbers, placement.mesh.devices.flat[0].device_kind)
    zeros = np.zeros((batch, length), np.int32)
    model._symbolic_build(data_batch=({"token_ids": zeros, "padding_mask": zeros.astype(bool)}, zeros,
                                      zeros.astype(bool)))
    model.optimizer.build(model.trainable_variables)
    state, shardings = abstract_state(model, placement)
    data = abstract_batch(batch, length, placement.data())
    started = time.perf_counter()
    # As Keras's JAX trainer jits its step under a distribution (`make_train_function`).
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, shardings))
    compiled = step.lower(state, data).compile()
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    per_device = (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
                  - memory.alias_size_in_bytes)
    return {"per_device_bytes": int(per_device), "temp_bytes": int(memory.temp_size_in_bytes),
            "argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
            "alias_bytes": int(memory.alias_size_in_bytes), "bytes_accessed": float(cost.get("bytes accessed", -1)),
            "trainable_weights": len(state[0]), "compile_seconds": round(seconds, 1)}


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gib(n: int) -> str:
    return f"{n / 2**30:7.3f} GiB"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8, help="sequences, global (over 'batch')")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=GEMMA_VOCAB, help="smaller only to try the script out")
    parser.add_argument("--tunings", nargs="+", default=list(TUNINGS), choices=TUNINGS)
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    placement = Placement(tpu_devices(TOPOLOGY))
    numbers = number_tokens(args.vocab)
    started = time.perf_counter()
    causal_lm = build(args.layers, args.vocab)
    print(f"built the model in {time.perf_counter() - started:.0f} s: "
          f"{causal_lm.count_params() / 1e6:.0f}M weights", flush=True)
    rows = []
    for tuning in ("full", "lora"):  # full first: enabling LoRA freezes the weights for good
        if tuning == "lora":
            causal_lm.backbone.enable_lora(LORA_RANK)
        if tuning not in args.tunings:
            continue
        for loss_name in args.losses:
            row = {"tuning": tuning, "loss": loss_name,
                   **compile_row(causal_lm, loss_name, numbers, placement, args.batch, args.length)}
            rows.append(row)
            print(f"{tuning:4} {loss_name:10} per device {gib(row['per_device_bytes'])}, temporaries "
                  f"{gib(row['temp_bytes'])}, accessed {row['bytes_accessed'] / 2**30:8.2f} GiB "
                  f"({row['compile_seconds']} s to compile)", flush=True)
    for row in rows:
        reference = next((r for r in rows if r["tuning"] == row["tuning"] and r["loss"] == "keras_scce"), None)
        if reference is not None:
            row["per_device_vs_keras_scce"] = round(row["per_device_bytes"] / reference["per_device_bytes"], 4)
            row["temp_vs_keras_scce"] = round(row["temp_bytes"] / reference["temp_bytes"], 4)
            row["bytes_accessed_vs_keras_scce"] = round(row["bytes_accessed"] / reference["bytes_accessed"], 4)
            print(f"{row['tuning']:4} {row['loss']:10} / keras_scce: per device {row['per_device_vs_keras_scce']:.3f}, "
                  f"bytes accessed {row['bytes_accessed_vs_keras_scce']:.3f}")
    if args.out:
        result = {
            "command": "python benchmarks/keras_pod_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.date.today().isoformat(),
            "versions": {"jax": jax.__version__, "libtpu": version("libtpu"), "keras": keras.__version__,
                         "keras-hub": version("keras-hub"), "ntl_jax": version("ntl_jax")},
            "topology": TOPOLOGY,
            "mesh": dict(zip(MESH_AXES, MESH_SHAPE)),
            "model": {"class": "keras_hub.models.GemmaCausalLM", **GEMMA_2B, "vocabulary_size": args.vocab,
                      "num_layers": args.layers, "layers_note": "Gemma 2B has 18; the loss touches only the head",
                      "dtype": "bfloat16", "tied_embedding": True, "lora_rank": LORA_RANK,
                      "optimizer": "AdamW(5e-5, weight_decay=0.01)"},
            "batch": {"sequences": args.batch, "length": args.length, "tokens_per_device":
                      args.batch * args.length // MESH_SHAPE[0]},
            "loss": {"keras_scce": "keras.losses.SparseCategoricalCrossentropy(from_logits=True)",
                     "ntl": f"ntl_jax.keras.NumberTokenLoss(number_loss='was', ntl_weight={NTL_WEIGHT})",
                     "fused": "ntl_jax.keras.FusedNumberTokenLossModel(causal_lm, <the ntl row's loss>, "
                              "device_kind=<the v5e's>)"},
            "layout": {"sharded": placement.sharded, "kept_whole": placement.kept_whole, "data": "('batch',)"},
            "per_device_bytes": "arguments + outputs + temporaries - aliased, of the compiled step, per device",
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
