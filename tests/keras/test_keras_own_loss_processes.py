"""A `.keras` file whose loss is a loss of your own loads in a fresh process that never
ran its code: the saved spec `my_number_losses:scaled_gap(scale=2.0)` names the module
(tests/fixtures/own_loss_module, no entry point), which loading imports. Where the
module cannot be imported, loading says which one."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("keras")

ROOT = pathlib.Path(__file__).resolve().parents[2]
OWN_MODULE = ROOT / "tests" / "fixtures" / "own_loss_module"

SAVE = """
import json, sys
import keras, numpy as np
import ntl_jax, ntl_jax.keras as ntl_keras
pieces = ["<pad>", "a", "+", *"0123456789"]
keras.utils.set_random_seed(0)
ids = keras.Input((5,), dtype="int32")
logits = keras.layers.Dense(len(pieces))(keras.layers.Embedding(len(pieces), 8)(ids))
model = keras.Model(ids, logits)
loss = ntl_keras.NumberTokenLoss(ntl_jax.NumberTokens.from_pieces(pieces),
                                 number_loss="my_number_losses:scaled_gap(scale=2)")
model.compile(loss=loss, optimizer="sgd")
x = np.array([[1, 3, 2, 4, 0], [5, 6, 2, 7, 1]], "int32")
y = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]], "int32")
model.save(sys.argv[1])
print(json.dumps({"loss": float(model.evaluate(x, y, verbose=0)), "spec": loss.get_config()["number_loss"]}))
"""

LOAD = """
import json, sys
import keras, numpy as np
import ntl_jax.keras  # registers the loss's class with Keras
assert "my_number_losses" not in sys.modules
model = keras.saving.load_model(sys.argv[1])
x = np.array([[1, 3, 2, 4, 0], [5, 6, 2, 7, 1]], "int32")
y = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]], "int32")
print(json.dumps({"loss": float(model.evaluate(x, y, verbose=0)), "spec": model.loss.get_config()["number_loss"],
                  "imported": "my_number_losses" in sys.modules}))
"""


def _python(code: str, *args: str, path: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERAS_BACKEND="jax")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_saved_loss_of_your_own_loads_in_a_fresh_process(tmp_path):
    path = str(tmp_path / "model.keras")
    saved = _python(SAVE, path, path=str(OWN_MODULE))
    assert saved.returncode == 0, saved.stderr[-3000:]
    before = json.loads(saved.stdout.splitlines()[-1])
    assert before["spec"] == "my_number_losses:scaled_gap(scale=2.0)"
    loaded = _python(LOAD, path, path=str(OWN_MODULE))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    after = json.loads(loaded.stdout.splitlines()[-1])
    assert after["imported"] and after["spec"] == before["spec"]
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-6)
    # Without the module on the path, loading names the module to make importable.
    missing = _python(LOAD, path, path=None)
    assert missing.returncode != 0
    assert "expected the module 'my_number_losses' of the spec 'my_number_losses:scaled_gap(scale=2.0)' to be " \
           "importable" in missing.stderr
