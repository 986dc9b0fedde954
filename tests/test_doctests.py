"""Runs the docstring examples of the core modules (the pages' examples: test_doc_examples.py)."""

import doctest

import pytest

import ntl_jax.fused
import ntl_jax.losses
import ntl_jax.metrics
import ntl_jax.nnx_head
import ntl_jax.number_tokens
import ntl_jax.objective
import ntl_jax.tokenizer_pieces

MODULES = [ntl_jax.number_tokens, ntl_jax.tokenizer_pieces, ntl_jax.losses, ntl_jax.objective, ntl_jax.fused,
           ntl_jax.nnx_head, ntl_jax.metrics]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
