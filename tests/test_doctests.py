"""Runs the docstring examples of the core modules (the pages' examples: test_doc_examples.py)."""

import doctest

import pytest

import ntl_jax._core.checks
import ntl_jax._core.cross_entropy
import ntl_jax._core.losses
import ntl_jax._core.number_tokens
import ntl_jax._core.objective
import ntl_jax._core.tokenizer_pieces
import ntl_jax.data.metrics
import ntl_jax.flax._nnx

MODULES = [ntl_jax._core.number_tokens, ntl_jax._core.tokenizer_pieces, ntl_jax._core.checks,
           ntl_jax._core.cross_entropy, ntl_jax._core.losses, ntl_jax._core.objective,
           ntl_jax.flax._nnx, ntl_jax.data.metrics]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
