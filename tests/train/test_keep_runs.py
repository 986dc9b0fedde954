"""`scripts/keep_runs.py`: a comparison's finished seeds kept whole, with their machine,
and put back so that the comparison reuses them."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "keep_runs.py"
spec = importlib.util.spec_from_file_location("keep_runs", SCRIPT)
keep_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keep_runs)


def _run(out, variant, seed, finished):
    d = out / variant / f"seed_{seed}"
    (d / "checkpoints" / "100").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"loss": variant, "seed": seed}))
    (d / "metrics.jsonl").write_text('{"step": 50}\n')
    if finished:
        (d / "results.json").write_text(json.dumps({"step": 100, "eval": {}}))


def test_only_seeds_that_every_variant_finished_are_kept_and_they_come_back(tmp_path):
    out, kept = tmp_path / "runs", tmp_path / "kept"
    for variant in ("ce", "ntl-was"):
        _run(out, variant, 0, finished=True)
        _run(out, variant, 10, finished=True)
    _run(out, "ce", 1, finished=True)
    _run(out, "ntl-was", 1, finished=False)

    assert keep_runs.keep(out, kept, 2) == ["seed_0", "seed_10"]
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == sorted(
        [f"{v}/seed_{s}/{name}" for v in ("ce", "ntl-was") for s in (0, 10) for name in keep_runs.KEPT]
        + ["machines.json"])
    machines = json.loads((kept / "machines.json").read_text())
    assert list(machines) == ["seed_0", "seed_10"] and all(machines.values())

    # A later part: seed 1 finished on another machine; the seeds kept before stay as kept.
    (out / "ntl-was" / "seed_1" / "results.json").write_text(json.dumps({"step": 100, "eval": {}}))
    (kept / "machines.json").write_text(json.dumps({"seed_0": "first", "seed_10": "first"}))
    assert keep_runs.keep(out, kept, 2) == ["seed_1"]
    assert json.loads((kept / "machines.json").read_text())["seed_0"] == "first"
    assert list(json.loads((kept / "machines.json").read_text())) == ["seed_0", "seed_1", "seed_10"]

    fresh = tmp_path / "fresh"
    assert keep_runs.restore(kept, fresh) == 6
    restored, trained = (d / "ce" / "seed_0" / "results.json" for d in (fresh, out))
    assert restored.read_text() == trained.read_text()
    assert not (fresh / "ce" / "seed_0" / "checkpoints").exists()
    assert keep_runs.restore(kept, fresh) == 0  # finished runs are left as they are
    # The comparison's summary names each seed's machine from the copy under its --out.
    assert json.loads((fresh / "machines.json").read_text()) == json.loads(
        (kept / "machines.json").read_text())


def test_runs_trained_elsewhere_are_kept_with_the_machine_given(tmp_path):
    out, kept = tmp_path / "part", tmp_path / "kept"
    for variant in ("ce", "smmd"):
        _run(out, variant, 15, finished=True)
    assert keep_runs.keep(out, kept, 2, machine="16 cores, JAX on NVIDIA H200") == ["seed_15"]
    assert json.loads((kept / "machines.json").read_text()) == {"seed_15": "16 cores, JAX on NVIDIA H200"}


def test_a_seed_is_not_kept_before_the_variants_not_yet_started_have_run_it(tmp_path):
    """A comparison starts a variant's directory only when its first run starts: the two
    runs of seed 0 finished so far are not the seed's six."""
    out, kept = tmp_path / "runs", tmp_path / "kept"
    for variant in ("ce", "ntl-was"):
        _run(out, variant, 0, finished=True)
    assert keep_runs.keep(out, kept, 6) == []
    assert not (kept / "ce").exists()
    for variant in ("del", "dist2", "smmd", "gce"):
        _run(out, variant, 0, finished=True)
    assert keep_runs.keep(out, kept, 6) == ["seed_0"]
    with pytest.raises(ValueError, match="expected at most 5 variants"):
        keep_runs.finished_seeds(out, 5)
