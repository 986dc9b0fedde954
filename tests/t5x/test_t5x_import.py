"""Without t5x, the modules of `ntl_jax.t5x` that run it say how to install it; `ntl_jax`
never needs it (nor does the loss the T5X models compute: tests/test_t5x_model_loss.py).

Runs everywhere: t5x's absence is simulated where it is installed.
"""

import importlib
import subprocess
import sys

import pytest

MODULES = ["ntl_jax.t5x.models", "ntl_jax.t5x.networks", "ntl_jax.t5x.xval", "ntl_jax.t5x.train", "ntl_jax.t5x.eval"]


@pytest.mark.parametrize("module", MODULES)
def test_import_without_t5x_says_how_to_install(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "t5x", None)  # makes `import t5x` raise ImportError
    for name in list(sys.modules):
        if name == "ntl_jax.t5x" or name.startswith("ntl_jax.t5x."):
            monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as info:
        importlib.import_module(module)
    message = str(info.value)
    assert "not on PyPI" in message
    assert "git+https://github.com/google-research/t5x" in message


def test_import_ntl_jax_does_not_import_t5x():
    code = ("import sys, ntl_jax; "
            "bad = [m for m in ('t5x', 'ntl_jax.t5x', 'tensorflow') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

