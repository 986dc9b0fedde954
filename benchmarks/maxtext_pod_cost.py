"""What CE + NTL costs in MaxText on a TPU pod: its train step compiled ahead of time by
MaxText's own `train_compile` for v5e-16 and v4-8, with and without vocabulary tiling,
stock against `ntl_jax.maxtext`; and, on a small step, against NTL read from the logits
(the by-hand swap that first cost 1.48x).

Run it in the Python >= 3.12 environment of the `maxtext` extra (libtpu compiles for a
TPU on any Linux x86-64 machine, nothing runs on one):

    python benchmarks/maxtext_pod_cost.py --out benchmarks/results/maxtext_pod_cost.json

`python benchmarks/maxtext_pod_cost.py --table` prints the committed results as the
MaxText guide's table (docs/guides/maxtext.md).

Each compile is a process of its own (MaxText sets up its config and libtpu once per
process), one at a time. Per-device memory is what XLA's memory analysis allocates
(arguments + outputs - aliased + temporaries), HBM traffic its cost analysis's "bytes
accessed"; both are deterministic. XLA's cost analysis counts a loop's body once: with
MaxText's scanned layers the stock step's layers are counted as one, so the traffic
ratios overstate NTL's share; the unrolled rows (`scan_layers=false`: each takes 17 GB and
minutes to compile) count every layer. The vocabulary tiles' scan stays a loop there,
counted once in both steps, and `traffic_bound` gives what NTL moves at most with every
tile counted; the `unrolled_tiles` rows unroll the tiles' loop too and count every tile
(their memory is that of a step that holds its tiles at once, not MaxText's).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "maxtext_pod_cost.json"

TOKENIZER = ["tokenizer_type=huggingface", "vocab_size=151936", "dataset_type=synthetic"]
# Qwen3-0.6B (tied embeddings, 151,936 tokens), 4,096 tokens per device, its layers scanned
# (MaxText's default) or unrolled (so that XLA's cost analysis counts each).
POD = ["model_name=qwen3-0.6b", "per_device_batch_size=2", "max_target_length=2048"]
UNROLLED = [*POD, "scan_layers=false"]
# A two-layer model at Qwen3's vocabulary, 256 tokens per device: MaxText fuses its head's
# matmul into the cross-entropy and never writes the logits.
SMALL = ["model_name=qwen3-0.6b", "override_model_config=true", "base_emb_dim=64", "base_num_decoder_layers=2",
         "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=128", "head_dim=32",
         "per_device_batch_size=1", "max_target_length=256"]
NTL = ["ntl_weight=0.3", "ntl_number_loss=was"]
# The same step with the vocabulary tiles' loop unrolled too (`_unrolled_tiles`), so that
# XLA's cost analysis counts every tile: for the traffic of the tiled steps alone.
MODELS = {"pod": POD, "unrolled": UNROLLED, "unrolled_tiles": UNROLLED, "small": SMALL}
RUNS = (
    [("pod", topology, tiling, variant) for topology in ("v5e-16", "v4-8") for tiling in (1, 4)
     for variant in ("stock", "ntl")]
    + [("unrolled", topology, tiling, variant) for topology in ("v5e-16", "v4-8") for tiling in (1, 4)
       for variant in ("stock", "ntl")]
    + [("unrolled_tiles", topology, 4, variant) for topology in ("v5e-16", "v4-8") for variant in ("stock", "ntl")]
    + [("small", "v5e-16", 1, variant) for variant in ("stock", "ntl", "from_logits")]
)


def _assets():
    import maxtext

    root = os.path.dirname(maxtext.__file__)
    return os.path.join(root, "configs", "base.yml"), os.path.join(root, "assets", "tokenizers", "qwen3-tokenizer")


def _ntl_from_logits(numbers, weight: float):
    """MaxText's per-token `cross_entropy_with_logits` plus `weight` x NTL-WAS read from the
    same logits (`ntl_jax.number_token_loss`; on the TPU its masked reductions)."""
    import jax.numpy as jnp
    from maxtext.utils import max_utils

    import ntl_jax

    stock = max_utils.cross_entropy_with_logits

    def cross_entropy_with_logits(logits, targets, z_loss=0.0):
        xent, z = stock(logits, targets, z_loss=z_loss)
        flat = logits.reshape((-1, 1, logits.shape[-1]))
        ids = jnp.argmax(targets, axis=-1).reshape((-1, 1))
        return xent + weight * ntl_jax.number_token_loss(flat, ids, numbers, reduction="none").reshape(xent.shape), z

    return cross_entropy_with_logits


def _unrolled_tiles():
    """MaxText's vocabulary tiling with its loops over the tiles unrolled (`lax.scan`'s
    `unroll=True`), the rest of `jax` as it is."""
    import functools
    import types

    import jax
    from maxtext.utils import vocabulary_tiling

    lax = types.SimpleNamespace(**{name: getattr(jax.lax, name) for name in dir(jax.lax) if not name.startswith("__")})
    lax.scan = functools.partial(jax.lax.scan, unroll=True)

    class Jax(types.ModuleType):
        def __getattr__(self, name):
            return lax if name == "lax" else getattr(jax, name)

    vocabulary_tiling.jax = Jax("jax (its vocabulary tiles unrolled)")


def compile_one(model: str, topology: str, tiling: int, variant: str) -> dict:
    """Compiles one train step in this process; returns its figures."""
    import contextlib

    from maxtext.trainers.pre_train import train_compile
    from maxtext.utils import max_utils

    import ntl_jax
    from ntl_jax.maxtext.install import pretraining
    from ntl_jax.maxtext.settings import split_argv

    base, tokenizer = _assets()
    argv = [None, base, f"compile_topology={topology}", "compile_topology_num_slices=1", "run_name=pod_cost",
            "base_output_directory=/tmp/maxtext_pod_cost", f"tokenizer_path={tokenizer}",
            f"num_vocab_tiling={tiling}", *TOKENIZER, *MODELS[model]]
    if model == "unrolled_tiles":
        _unrolled_tiles()
    compiled = []
    stock_compile = train_compile.jit_and_compile
    train_compile.jit_and_compile = lambda *a, **k: compiled.append(stock_compile(*a, **k)) or compiled[-1]
    context = contextlib.nullcontext()
    if variant == "ntl":
        argv, settings = split_argv(argv + NTL)
        context = pretraining(settings)
    elif variant == "from_logits":
        from transformers import AutoTokenizer

        numbers = ntl_jax.NumberTokens.from_tokenizer(AutoTokenizer.from_pretrained(tokenizer))
        max_utils.cross_entropy_with_logits = _ntl_from_logits(numbers, 0.3)
    with context:
        train_compile.main(argv)
    memory = compiled[0].memory_analysis()
    cost = compiled[0].cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {
        "model": model, "topology": topology, "num_vocab_tiling": tiling, "variant": variant,
        "per_device_bytes": int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
        "temp_bytes": int(memory.temp_size_in_bytes),
        "bytes_accessed": float(cost["bytes accessed"]),
    }


def _launch(run) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_ACCELERATOR_TYPE="v5litepod-16")
    done = subprocess.run([sys.executable, __file__, "--one", *map(str, run)], env=env, capture_output=True, text=True)
    found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode or not found:
        raise RuntimeError(f"{run} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(found[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the rows and the command as JSON here")
    parser.add_argument("--table", action="store_true", help="print the committed results as the guide's table")
    parser.add_argument("--one", nargs=4, metavar=("MODEL", "TOPOLOGY", "TILING", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text())), end="")
        return
    if args.one:
        model, topology, tiling, variant = args.one
        print("ROW " + json.dumps(compile_one(model, topology, int(tiling), variant)), flush=True)
        return
    # One compile at a time (an unrolled step takes 17 GB to compile); the rows done are
    # kept beside --out, so that a stopped run resumes.
    done_file = pathlib.Path((args.out or "/tmp/maxtext_pod_cost.json") + ".rows")
    done = [json.loads(line) for line in done_file.read_text().splitlines()] if done_file.exists() else []
    rows = []
    for run in RUNS:
        key = dict(zip(("model", "topology", "num_vocab_tiling", "variant"), run))
        row = next((r for r in done if all(r[k] == v for k, v in key.items())), None)
        if row is None:
            row = _launch(run)
            with done_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        rows.append(row)
    for row in rows:
        stock = next(r for r in rows if r["variant"] == "stock" and all(
            r[k] == row[k] for k in ("model", "topology", "num_vocab_tiling")))
        for key in ("per_device_bytes", "temp_bytes", "bytes_accessed"):
            row[f"{key}_vs_stock"] = round(row[key] / stock[key], 4)
        if row["num_vocab_tiling"] > 1 and row is not stock and row["model"] != "unrolled_tiles":
            row["bytes_accessed_vs_stock_at_most"] = round(traffic_bound(row, stock), 4)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"command": "python benchmarks/maxtext_pod_cost.py --out " + args.out,
                       "maxtext": _version("maxtext"), "jax": _version("jax"), "libtpu": _version("libtpu"),
                       **{name: args + TOKENIZER for name, args in MODELS.items()}, "ntl": NTL, "rows": rows}, f,
                      indent=1)
            f.write("\n")
    done_file.unlink(missing_ok=True)


def traffic_bound(row: dict, stock: dict) -> float:
    """At most what the tiled `row` moves against `stock` with every tile counted.

    XLA's cost analysis counts the tiles' loop body once, in both steps. Where NTL adds
    bytes inside and outside the loop and takes none away, its extra bytes counted once
    per tile (`tiles` x the extra) bound its share from above, against the stock step as
    counted: the stock tiles left uncounted only add to both sides."""
    return 1 + row["num_vocab_tiling"] * (row["bytes_accessed"] - stock["bytes_accessed"]) / stock["bytes_accessed"]


STEPS = {"pod": "Qwen3-0.6B", "unrolled": "Qwen3-0.6B, unrolled", "unrolled_tiles": "Qwen3-0.6B, unrolled, tiles too",
         "small": "small"}
LOSSES = {"stock": "MaxText", "ntl": "+ NTL", "from_logits": "+ NTL from the logits"}


def table(results: dict) -> str:
    """The guide's Markdown table of `results` (the JSON `--out` writes): six columns, so
    that it fits the site's text column at a laptop's width."""
    lines = ["| step | topology | tiles | loss | memory per device | HBM traffic |", "|---|---|---|---|---|---|"]
    for row in results["rows"]:
        traffic = f"{row['bytes_accessed_vs_stock']:.4f}x"
        if row["model"] == "unrolled" and "bytes_accessed_vs_stock_at_most" in row:
            # Where every layer is counted, the bound over the tiles is the step's.
            traffic += f", ≤ {row['bytes_accessed_vs_stock_at_most']:.4f}x"
        lines.append(
            f"| {STEPS[row['model']]} | {row['topology']} | {row['num_vocab_tiling']} | {LOSSES[row['variant']]} "
            f"| {row['per_device_bytes'] / 2**20:,.1f} MiB ({row['per_device_bytes_vs_stock']:.4f}x) "
            f"| {row['bytes_accessed'] / 2**30:,.2f} GiB ({traffic}) |")
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
