"""A script beside the checkout imports the installed `ntl_jax`, not the checkout's folder.

A clone is a folder named `ntl_jax`. Python puts a script's own folder first on its path,
and a folder there named `ntl_jax` without an `__init__.py` is a namespace package that
wins over an editable install's import hook: with the package at the top of the
repository, a script saved beside the clone failed with `AttributeError: module 'ntl_jax'
has no attribute 'NumberTokens'`. With the source under `src/`, the installed package
(editable or not) is a regular package found on the path, and it wins wherever the
script stands.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = "import ntl_jax\nprint(ntl_jax.__file__)\nprint(ntl_jax.NumberTokens.__name__)\n"


def _env():
    """The environment of a reader's shell: no PYTHONPATH, which would hide the layout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The `ntl_jax/__init__.py` this interpreter imports from a folder with nothing beside."""
    code = "import importlib.util; spec = importlib.util.find_spec('ntl_jax'); print(spec.origin if spec else '')"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path_factory.mktemp("elsewhere"), env=_env(),
                         capture_output=True, text=True, check=True)
    if not run.stdout.strip():
        pytest.skip("ntl_jax is not installed in this interpreter (pip install -e .)")
    return pathlib.Path(run.stdout.strip()).resolve()


def _imports(command, cwd):
    run = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True)
    assert run.returncode == 0, f"from {cwd}:\n{run.stderr[-3000:]}"
    file, name = run.stdout.split()
    return pathlib.Path(file).resolve(), name


def test_a_script_saved_beside_a_clone_imports_the_installed_package(tmp_path, installed):
    clone = tmp_path / "ntl_jax"  # what a clone's top holds: no __init__.py
    (clone / "src").mkdir(parents=True)
    (clone / "README.md").write_text("# ntl_jax\n")
    (tmp_path / "script.py").write_text(SCRIPT)
    assert _imports([sys.executable, "script.py"], tmp_path) == (installed, "NumberTokens")


@pytest.mark.skipif(ROOT.name != "ntl_jax", reason="this checkout's folder is not named ntl_jax")
def test_python_run_from_this_checkouts_parent_imports_the_installed_package(installed):
    assert _imports([sys.executable, "-c", SCRIPT], ROOT.parent) == (installed, "NumberTokens")
