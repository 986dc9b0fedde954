"""Will T5X + NTL fit a pod, and what does NTL add there? `python -m ntl_jax.t5x.compile_check`
on the fine-tuning gin files (`experiments/finetune/<size>_arithmetic.gin`: the gin's
batch of 32 and lengths 192 / 32) for TPU pods, compiled ahead of time on this machine.

Rows per size and topology (each compile_check's report, per chip):
- `T5X CE`: T5X's own `EncoderDecoderModel` (CE + z-loss), the model NTL replaces;
- `CE (ntl_weight=0)`: the NTL model with `NTL_WEIGHT = 0.0` (`losses/ce.gin`): CE only,
  with NTL still computed as a metric, from the logits;
- `NTL`: CE + 0.3 * NTL-WAS from the logits (`NTL_FUSED_LOSS = False`);
- `NTL fused`: the same from the hidden states and the kernel in vocabulary chunks
  (`NTL_FUSED_LOSS = True`), vocabulary-parallel over `model`;
- `gin default`: the gin file as shipped (`NTL_FUSED_LOSS = 'auto'`: fused where each
  chip holds at least d_model target tokens, else from the logits).

Ratios are to `CE (ntl_weight=0)`, as the question is what NTL adds to a CE run.

    python benchmarks/t5x_pod_fit.py [--sizes base large xl] [--topologies v5e:4x4 v4:2x2x4]

Needs T5X on the path and libtpu (`pip install 'jax[tpu]'`). The stock T5 SentencePiece
file is on gs://; offline (`--offline_vocabulary`, default on) the shipped digit-split
model stands in for it (the number tokens are the same ten digits; the network's
vocabulary size, 32128, comes from the model file). T5X has no default layout for v5e
chips, so every run names one: `model_parallel_submesh = (1, 1, 1, 1)` (one chip per
model replica, T5X's fine-tuning default of `num_partitions = 1`). Writes
`benchmarks/results/t5x_pod_fit.json` (merged with what is there) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "t5x_pod_fit.json"
ROWS = {
    "T5X CE": ["--gin.MODEL=@models.EncoderDecoderModel()"],
    "CE (ntl_weight=0)": ["--gin.NTL_WEIGHT=0.0", "--gin.NTL_FUSED_LOSS=False"],
    "NTL": ["--gin.NTL_FUSED_LOSS=False"],
    "NTL fused": ["--gin.NTL_FUSED_LOSS=True"],
    "gin default": [],
}
BASELINE = "CE (ntl_weight=0)"
GIB = 1024**3


def compile_report(flags: list[str], label: str) -> dict:
    """The JSON report of `python -m ntl_jax.t5x.compile_check` with `flags` (the topology,
    gin files and bindings), one chip per model replica, nothing written."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "report.json"
        command = [sys.executable, "-m", "ntl_jax.t5x.compile_check", *flags, f'--gin.MODEL_DIR="{tmp}/unused"',
                   "--gin.partitioning.PjitPartitioner.model_parallel_submesh=(1,1,1,1)", f"--json={out}"]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode not in (0, 2):  # 2: does not fit, still a report
            raise SystemExit(f"{label}: exit {result.returncode}\n{result.stderr[-4000:]}")
        return json.loads(out.read_text())


def run_one(size: str, topology: str, row: str, offline: bool) -> dict:
    from ntl_jax.data.vocabulary import DEFAULT_SPM_PATH

    flags = [f"--topology={topology}", f"--gin_file=t5x_configs/experiments/finetune/{size}_arithmetic.gin",
             *ROWS[row]]
    if offline:
        flags.append(f"--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file='{DEFAULT_SPM_PATH}'")
    return compile_report(flags, f"{size} {topology} {row}")


def measure(results: dict, path: pathlib.Path, sizes, topologies, rows, run_one) -> None:
    """`run_one(size, topology, row)` for each, merged into `results` under
    `"<size> <topology>"` and written to `path` as each row comes."""
    for size in sizes:
        for topology in topologies:
            for row in rows:
                report = run_one(size, topology, row)
                results.setdefault(f"{size} {topology}", {})[row] = report
                path.write_text(json.dumps(results, indent=1) + "\n")
                print(f"{size} {topology} {row}: {report['total_bytes'] / GIB:.3f} GiB per chip, "
                      f"fits: {report['fits']}", file=sys.stderr, flush=True)


def table(results: dict) -> str:
    lines = ["| size | topology | row | per chip: params + optimizer, temporaries = total (of the chip's HBM) "
             "| vs CE: memory, HBM traffic | collectives per step |",
             "|---|---|---|---|---|---|"]
    for key, rows in results.items():
        size, topology = key.split(" ")
        base = rows.get(BASELINE)
        for row in ROWS:
            if row not in rows:
                continue
            r = rows[row]
            moved = " + ".join(f"{c['bytes'] / GIB:.2f} GiB {kind} ({c['count']})"
                              for kind, c in sorted(r["collectives"].items()))
            ratio = (f"{r['total_bytes'] / base['total_bytes']:.3f}x, "
                     f"{r['bytes_accessed'] / base['bytes_accessed']:.3f}x") if base else "-"
            fits = "" if r["fits"] else ", **does not fit**"
            lines.append(
                f"| {size} | {topology} | {row} | {(r['params_bytes'] + r['optimizer_bytes']) / GIB:.2f} + "
                f"{r['temp_bytes'] / GIB:.2f} = {r['total_bytes'] / GIB:.2f} GiB "
                f"(of {r['hbm_bytes'] / GIB:.0f}){fits} | {ratio} | {moved or 'none'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["base", "large", "xl"])
    parser.add_argument("--topologies", nargs="+", default=["v5e:4x4", "v4:2x2x4"])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--offline_vocabulary", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--table_only", action="store_true", help="print the table of the stored results")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="the JSON file to merge into")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    if not args.table_only:
        measure(results, args.results, args.sizes, args.topologies, args.rows,
                lambda size, topology, row: run_one(size, topology, row, args.offline_vocabulary))
    print(table(results))


if __name__ == "__main__":
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    main()
