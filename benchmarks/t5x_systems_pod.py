"""The paper's five systems on a pod: what each costs per chip against vanilla T5.
`python -m ntl_jax.t5x.compile_check` on the from-scratch experiment
`experiments/scratch/<size>_math13.gin` (T5.1.1, the shipped digit-level vocabulary, the
gin's batch of 32 and lengths 192 / 32) for TPU pods, compiled ahead of time here.

Rows (the flags after the experiment file), each compile_check's report per chip:
- `T5, CE`: T5X's own `EncoderDecoderModel` (CE + z-loss), vanilla T5 and the baseline;
- `T5 + NTL-MSE`: `losses/ntl_mse.gin`; `T5 + NTL-WAS`: the experiment as shipped;
- `RT`, `RT + NTL-MSE`: `systems/rt.gin`, `systems/rt_ntl.gin` (the RT vocabulary, 1,664
  rows, and its float encodings);
- `xVal`: `systems/xval.gin` (its model, vocabulary and number head; unpacked batches,
  where the others pack).

    python benchmarks/t5x_systems_pod.py [--sizes base] [--topologies v5e:4x4 v4:2x2x4]

Needs T5X on the path and libtpu (`pip install 'jax[tpu]'`). T5X has no default layout
for v5e chips, so every run names one: `model_parallel_submesh = (1, 1, 1, 1)` (one chip
per model replica). Writes `benchmarks/results/t5x_systems_pod.json` (merged with what is
there) and prints the table the T5X guide shows.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from t5x_pod_fit import GIB, compile_report, measure  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "t5x_systems_pod.json"
ROWS = {
    "T5, CE": ["--gin.MODEL=@models.EncoderDecoderModel()"],
    "T5 + NTL-MSE": ["--gin_file=t5x_configs/losses/ntl_mse.gin"],
    "T5 + NTL-WAS": [],
    "RT": ["--gin_file=t5x_configs/systems/rt.gin"],
    "RT + NTL-MSE": ["--gin_file=t5x_configs/systems/rt_ntl.gin"],
    "xVal": ["--gin_file=t5x_configs/systems/xval.gin"],
}
BASELINE = "T5, CE"


def run_one(size: str, topology: str, row: str) -> dict:
    return compile_report([f"--topology={topology}", f"--gin_file=t5x_configs/experiments/scratch/{size}_math13.gin",
                           *ROWS[row]], f"{size} {topology} {row}")


def table(results: dict) -> str:
    lines = ["| size | topology | system | per chip: params + optimizer, temporaries = total (of the chip's HBM) "
             "| vs T5 (CE): memory, HBM traffic |",
             "|---|---|---|---|---|"]
    for key, rows in results.items():
        size, topology = key.split(" ")
        base = rows[BASELINE]
        for row in ROWS:
            r = rows[row]
            fits = "" if r["fits"] else ", **does not fit**"
            memory, traffic = r["total_bytes"] / base["total_bytes"], r["bytes_accessed"] / base["bytes_accessed"]
            lines.append(
                f"| {size} | {topology} | {row} | {(r['params_bytes'] + r['optimizer_bytes']) / GIB:.3f} + "
                f"{r['temp_bytes'] / GIB:.3f} = {r['total_bytes'] / GIB:.3f} GiB (of {r['hbm_bytes'] / GIB:.0f}){fits} "
                f"| {memory:.3f}x, {traffic:.3f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["base"])
    parser.add_argument("--topologies", nargs="+", default=["v5e:4x4", "v4:2x2x4"])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--table_only", action="store_true", help="print the table of the stored results")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="the JSON file to merge into")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    if not args.table_only:
        measure(results, args.results, args.sizes, args.topologies, args.rows, run_one)
    print(table(results))


if __name__ == "__main__":
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    main()
