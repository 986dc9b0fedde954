"""The public API is what the API reference (docs/api.md) documents, and nothing else.

A `::: ntl_jax.<package>.<name>` entry documents a name of a public package, which must
list exactly the documented names in its `__all__` (and may list documented modules of
its own, as `ntl_jax` lists `losses`); a `::: <module>` entry documents a whole module,
whose `__all__` must hold every public function and class it defines. A module may be
both (`ntl_jax.losses`: the module's page, and each of its names).
"""

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests import docs_pages


def _is_module(entry):
    try:
        return importlib.util.find_spec(entry) is not None
    except ModuleNotFoundError:  # a name inside a module that is no package (`ntl_jax.losses.was`)
        return False


ENTRIES = re.findall(r"^::: (ntl_jax(?:\.\w+)+)$", docs_pages.page("api.md").read_text(encoding="utf-8"), re.M)
MODULES = [entry for entry in ENTRIES if _is_module(entry)]
NAMES = defaultdict(set)
for entry in ENTRIES:
    if entry not in MODULES:
        package, name = entry.rsplit(".", 1)
        NAMES[package].add(name)


def _import(module):
    if module.startswith("ntl_jax.t5x."):
        pytest.importorskip("t5x.models", reason="t5x is not installed (it is not on PyPI; see the README)")
    if module.startswith("ntl_jax.tunix"):
        pytest.importorskip("tunix", reason="Tunix is not installed (the tunix extra)")
    if module.startswith("ntl_jax.keras"):
        os.environ.setdefault("KERAS_BACKEND", "jax")  # read when Keras is first imported
        pytest.importorskip("keras_hub", reason="KerasHub is not installed (the keras extra)")
    return importlib.import_module(module)


def _documented_submodules(package):
    """The names of `package`'s own modules that the reference documents whole."""
    return {entry.rsplit(".", 1)[1] for entry in MODULES if entry.rsplit(".", 1)[0] == package}


def test_the_reference_documents_the_core_and_each_integration():
    assert set(NAMES) == {"ntl_jax", "ntl_jax.losses", "ntl_jax.flax", "ntl_jax.seqio", "ntl_jax.tunix",
                          "ntl_jax.keras"}
    assert set(MODULES) == {"ntl_jax.losses", "ntl_jax.t5x.models", "ntl_jax.t5x.xval", "ntl_jax.t5x.networks",
                            "ntl_jax.seqio.xval", "ntl_jax.seqio.tasks", "ntl_jax.data", "ntl_jax.data.metrics"}


@pytest.mark.parametrize("package", sorted(NAMES))
def test_each_package_exports_exactly_its_documented_names(package):
    module = _import(package)
    listed = set(module.__all__)
    modules = {name for name in listed if inspect.ismodule(getattr(module, name))}
    assert listed - modules == NAMES[package]
    assert modules <= _documented_submodules(package), sorted(modules - _documented_submodules(package))
    exported = {name for name in dir(module)
                if not name.startswith("_") and not inspect.ismodule(getattr(module, name))}
    assert exported == NAMES[package]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_documented_module_lists_what_it_defines(name):
    module = _import(name)
    assert all(hasattr(module, item) for item in module.__all__), module.__all__
    defined = {item for item, value in vars(module).items()
               if not item.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
               and value.__module__ == module.__name__}
    assert defined <= set(module.__all__), sorted(defined - set(module.__all__))


def test_import_ntl_jax_alone_shows_only_its_api():
    code = "import ntl_jax; print(sorted(n for n in dir(ntl_jax) if not n.startswith('_')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # Its names, and the documented module of the number losses it imports (`ntl_jax.losses.was(...)`).
    assert "losses" in _documented_submodules("ntl_jax")
    assert out.strip() == str(sorted(NAMES["ntl_jax"] | {"losses"}))
