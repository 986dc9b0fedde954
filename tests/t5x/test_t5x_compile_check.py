"""`python -m ntl_jax.t5x.compile_check` on the tiny NTL gin for a v5e:2x2 slice (four
chips, one host), compiled with libtpu ahead of time: the report's layout and per-chip
figures, a config that does not fit, and the two ways a run is refused (a topology
libtpu does not know; a chip T5X has no default layout for, with more than one
partition), and the check from the topology and the gin alone. Skipped without t5x or
libtpu.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jax[tpu]')")

GIN = "--gin_file=t5x_configs/experiments/scratch/tiny_byte_arithmetic.gin"
ONE_CHIP = "--gin.partitioning.PjitPartitioner.model_parallel_submesh=(1,1,1,1)"


def _check(tmp_path, *flags):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "ntl_jax.t5x.compile_check", GIN, f'--gin.MODEL_DIR="{tmp_path / "unused"}"',
               *flags]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("compile_check")
    result = _check(tmp_path, "--topology=v5e:2x2", ONE_CHIP, f"--json={tmp_path / 'report.json'}")
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads((tmp_path / "report.json").read_text()), result.stdout


def test_the_report_lays_the_step_out_over_the_slice(report):
    r, text = report
    assert (r["topology"], r["device_kind"], r["chips"], r["hosts"]) == ("v5e:2x2", "TPU v5 lite", 4, 1)
    assert r["mesh"] == {"data": 4, "model": 1}
    assert r["batch_size"] == 32 and r["feature_lengths"] == {"inputs": 192, "targets": 32}
    assert r["ntl"] == {"ntl_weight": 0.3, "number_loss": "was", "fused": "auto"}  # the gin files' default
    assert r["fits"] and r["hbm_bytes"] == 16 * 1024**3
    # Each chip holds the whole (replicated) model and a quarter of the batch, packed: 8
    # rows of int32 encoder tokens, segment ids and positions (192 each) and decoder
    # targets, inputs, loss weights, segment ids and positions (32 each).
    assert r["batch_bytes"] == 8 * (3 * 192 + 5 * 32) * 4
    assert r["params_bytes"] > 0
    assert r["total_bytes"] >= r["params_bytes"] + r["optimizer_bytes"] + r["batch_bytes"]
    # Data parallel: the float32 gradients of every parameter are summed across the chips.
    assert r["collectives"]["all-reduce"]["bytes"] >= r["params_bytes"]
    assert "FITS" in text and "per chip:" in text


def test_a_config_that_does_not_fit_says_so_and_exits_2(tmp_path):
    result = _check(tmp_path, "--topology=v5e:2x2", ONE_CHIP, "--hbm_gib=0.0001")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "DOES NOT FIT" in result.stdout


def test_an_unknown_topology_gets_libtpus_word_not_a_traceback(tmp_path):
    result = _check(tmp_path, "--topology=v9:1x1", ONE_CHIP)
    assert result.returncode == 1
    assert "libtpu could not make the topology 'v9:1x1'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_topology_and_the_gin_are_enough(tmp_path, report):
    """No MODEL_DIR (nothing is written) and no layout: T5X has none for v5e chips, so the
    check lays one partition per replica out data-parallel, says so, and reports what
    the explicit layout does."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    result = subprocess.run([sys.executable, "-m", "ntl_jax.t5x.compile_check", "--topology=v5e:2x2", GIN,
                             f"--json={tmp_path / 'report.json'}"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "layout: data-parallel, model_parallel_submesh=(1, 1, 1, 1) (T5X has no default layout" in result.stdout
    got = json.loads((tmp_path / "report.json").read_text())
    assert got["layout"].startswith("data-parallel") and report[0]["layout"] is None
    assert {k: v for k, v in got.items() if k != "layout"} == {k: v for k, v in report[0].items() if k != "layout"}
    assert not list(tmp_path.glob("**/checkpoint*"))


def test_a_chip_without_a_default_t5x_layout_names_the_setting(tmp_path):
    # T5X's default_mesh has no layout for v5e chips; with two partitions per replica the
    # check does not guess one: a pod run would stop the same way.
    result = _check(tmp_path, "--topology=v5e:2x2", "--gin.partitioning.PjitPartitioner.num_partitions=2")
    assert result.returncode == 1
    assert "T5X would not start on this pod" in result.stderr
    assert "model_parallel_submesh" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("system", ["rt_ntl", "xval"])
def test_the_papers_baselines_compile_for_the_slice(tmp_path, system):
    result = _check(tmp_path, "--topology=v5e:2x2", ONE_CHIP, f"--gin_file=t5x_configs/systems/{system}.gin",
                    f"--json={tmp_path / 'report.json'}")
    assert result.returncode == 0, result.stderr[-5000:]
    r = json.loads((tmp_path / "report.json").read_text())
    if system == "xval":
        # Unpacked: 8 rows of int32 encoder tokens and float32 scales (192 each), and decoder
        # targets, inputs and loss weights (int32) with decoder scales and target values
        # (float32), 32 each.
        assert r["ntl"] == {} and r["batch_bytes"] == 8 * (2 * 192 + 5 * 32) * 4
    else:
        assert r["ntl"] == {"ntl_weight": 0.3, "number_loss": "mse", "fused": "auto"}
        assert r["batch_bytes"] == 8 * (3 * 192 + 5 * 32) * 4
    assert r["fits"]
