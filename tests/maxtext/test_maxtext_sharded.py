"""NTL inside MaxText's vocabulary tiles on 8 host CPU devices (`sharded_check.py`)."""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("maxtext")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_in_the_tiles_of_a_sharded_batch_ntl_is_the_untiled_loss():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "maxtext" / "sharded_check.py")], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.splitlines()[-1] == "OK"
