"""`import ntl_jax` exports exactly what the API reference (docs/api.md) documents."""

import importlib.util
import inspect
import re

import ntl_jax
from tests import docs_pages


def test_the_top_level_names_are_the_documented_ones():
    api = docs_pages.page("api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: ntl_jax\.(\w+)$", api, re.M))
    # `::: ntl_jax.metrics` documents a module of its own, not a name of `ntl_jax`
    functions_and_classes = {name for name in documented if importlib.util.find_spec(f"ntl_jax.{name}") is None}
    assert functions_and_classes == set(ntl_jax.__all__)
    exported = {name for name in dir(ntl_jax)
                if not name.startswith("_") and not inspect.ismodule(getattr(ntl_jax, name))}
    assert exported == set(ntl_jax.__all__)
