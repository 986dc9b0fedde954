"""Keeps the finished seeds of a comparison that runs in parts, so that it resumes on
another machine or checkout; or puts them back.

    python scripts/keep_runs.py keep runs/multiplication_past_the_floor \
        evidence/multiplication_past_the_floor --runs-per-seed 6
    python scripts/keep_runs.py restore evidence/multiplication_past_the_floor runs/multiplication_past_the_floor

`keep` copies what `ntl-jax compare` reads of a finished run (`config.json`,
`results.json`, `metrics.jsonl`; not its checkpoints) for every seed whose runs have all
finished (`--runs-per-seed`, the comparison's losses times their weights: a variant not
yet started has no directory to count), so that a seed's runs, which the comparison
pairs, come from one machine (per-seed values follow the machine's float kernels), and
writes which machine that was: this one, or `--machine` for runs trained elsewhere
(`compare --only-seeds` there).
`restore` copies them back under a comparison's `--out`, with `machines.json`; rerunning
its command then reuses them, trains the rest and names each seed's machine. Nothing here
reads a run's metrics.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))  # this checkout's ntl_jax

from ntl_jax.cli.compare import MACHINES, machine_name, read_machines  # noqa: E402

KEPT = ("config.json", "results.json", "metrics.jsonl")


def finished_seeds(out: pathlib.Path, runs_per_seed: int) -> dict[str, list[pathlib.Path]]:
    """`{seed_k: [run dirs]}` for the seeds all `runs_per_seed` variants under `out` have
    finished."""
    variants = sorted(p for p in out.iterdir() if p.is_dir())
    if len(variants) > runs_per_seed:
        raise ValueError(f"{out}: expected at most {runs_per_seed} variants (--runs-per-seed), "
                         f"found {len(variants)}: {' '.join(v.name for v in variants)}")
    if len(variants) < runs_per_seed:
        return {}  # a variant has not started: no seed has all its runs
    seeds = sorted({s.name for v in variants for s in v.glob("seed_*")})
    kept = {}
    for seed in seeds:
        dirs = [v / seed for v in variants]
        if all((d / "results.json").exists() and (d / "config.json").exists() for d in dirs):
            kept[seed] = dirs
    return kept


def keep(out: pathlib.Path, kept: pathlib.Path, runs_per_seed: int,
         machine: str | None = None) -> list[str]:
    finished = finished_seeds(out, runs_per_seed)
    kept.mkdir(parents=True, exist_ok=True)
    machines = read_machines(str(kept))
    new = []
    for seed, dirs in finished.items():
        if seed in machines:
            continue  # kept before, from the machine that trained it
        for d in dirs:
            target = kept / d.parent.name / seed
            target.mkdir(parents=True, exist_ok=True)
            for name in KEPT:
                if (d / name).exists():
                    shutil.copy2(d / name, target / name)
        machines[seed] = machine or machine_name()
        new.append(seed)
    write_machines(kept, machines)
    return new


def write_machines(folder: pathlib.Path, machines: dict[str, str]) -> None:
    """`<folder>/machines.json`, in seed order (the form `read_machines` reads)."""
    in_seed_order = dict(sorted(machines.items(), key=lambda kv: int(kv[0][5:])))
    (folder / MACHINES).write_text(json.dumps(in_seed_order, indent=1) + "\n")


def restore(kept: pathlib.Path, out: pathlib.Path) -> int:
    """Copies the kept runs back under `out`, and which machine trained each seed, which
    the comparison's summary names."""
    if (kept / MACHINES).exists():
        out.mkdir(parents=True, exist_ok=True)
        write_machines(out, read_machines(str(out)) | read_machines(str(kept)))
    copied = 0
    for run in kept.glob("*/seed_*"):
        target = out / run.parent.name / run.name
        if (target / "results.json").exists():
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (run / name).exists():
                shutil.copy2(run / name, target / name)
        copied += 1
    return copied


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("keep", "restore"))
    parser.add_argument("source", type=pathlib.Path)
    parser.add_argument("destination", type=pathlib.Path)
    parser.add_argument("--runs-per-seed", type=int, default=None,
                        help="keep (required): how many runs each seed has, the comparison's losses "
                             "times their weights and sigmas")
    parser.add_argument("--machine", default=None,
                        help="keep: the machine that trained the runs, where it is not this one "
                             "(default: this one, as compare names it)")
    args = parser.parse_args()
    if args.action == "keep":
        if args.runs_per_seed is None or args.runs_per_seed < 1:
            parser.error(f"keep needs --runs-per-seed N >= 1, got {args.runs_per_seed}")
        try:
            new = keep(args.source, args.destination, args.runs_per_seed, args.machine)
        except ValueError as e:
            parser.error(str(e))
        print(f"kept {len(new)} finished seed(s): {' '.join(new) or 'none'}")
    else:
        print(f"restored {restore(args.source, args.destination)} finished run(s)")


if __name__ == "__main__":
    main()
