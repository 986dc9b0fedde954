"""Runs the docstring examples of the core modules and the README's quickstart."""

import doctest
import pathlib

import pytest

import ntl_jax.fused
import ntl_jax.losses
import ntl_jax.nnx_head
import ntl_jax.number_tokens
import ntl_jax.objective
import ntl_jax.tokenizer_pieces

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


MODULES = [ntl_jax.number_tokens, ntl_jax.tokenizer_pieces, ntl_jax.losses, ntl_jax.objective, ntl_jax.fused,
           ntl_jax.nnx_head]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


def test_readme_quickstart():
    pytest.importorskip("optax")
    result = doctest.testfile(str(README), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5
    assert result.failed == 0
