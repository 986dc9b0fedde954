"""A Flax network's hidden states before its logits projection, for the fused loss.

`hidden_states_and_kernel` runs a network with its output projection replaced by the
identity, so the network returns `hidden` with `logits == hidden @ kernel`, and finds
that projection's `kernel` in the parameters. It recognises the two heads of T5-style
networks (ours and T5X's `t5x.examples`): an untied projection module named
`logits_dense` (`DenseGeneral`, kernel `[d_model, vocab]`), and logits tied to the
token embedding through `Embed.attend` (kernel `embedding.T`; any scaling the network
applies after `attend`, such as T5's `1/sqrt(d_model)`, lands on `hidden`, which is
where `fused_cross_entropy_and_ntl` needs it).
"""

from __future__ import annotations

import contextlib
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

LOGITS_MODULE = "logits_dense"


def _param(params: Any, path: tuple[str, ...], name: str):
    node = params
    for key in path + (name,):
        node = node[key]
    return node


@contextlib.contextmanager
def projection_skipped():
    """Within this context, a network's logits projection returns its input.

    Yields a list that, once the network has run, holds where its projection's kernel
    is: pass it with the parameters to `projection_kernel`.
    """
    heads = []

    def skip_projection(next_fun, fun_args, fun_kwargs, context):
        is_dense = context.module.name == LOGITS_MODULE and context.method_name == "__call__"
        is_attend = context.method_name == "attend"
        if not (is_dense or is_attend):
            return next_fun(*fun_args, **fun_kwargs)
        # The dtype the projection computes in (T5X's Embed.attend has its own).
        dtype = getattr(context.module, "attend_dtype", None) if is_attend else None
        dtype = dtype or getattr(context.module, "dtype", None)
        heads.append((tuple(context.module.scope.path), "kernel" if is_dense else "embedding", dtype))
        return fun_args[0]

    with nn.intercept_methods(skip_projection):
        yield heads


def projection_kernel(params: Any, heads: list):
    """`(kernel, dtype)`: the `[d_model, vocab]` kernel of the projection
    `projection_skipped` recorded, and the dtype that projection computes in (None:
    its inputs' own), to cast hidden states and kernel to as it would.

    Raises:
      ValueError: when the network called neither a `logits_dense` module nor
        `Embed.attend`, or more than one of them.
    """
    if len(heads) != 1:
        raise ValueError(
            f"expected the network to compute its logits with one '{LOGITS_MODULE}' module or one "
            f"Embed.attend call, found {len(heads)}: {heads}"
        )
    path, name, dtype = heads[0]
    kernel = _param(params, path, name)
    return (jnp.transpose(kernel) if name == "embedding" else kernel), dtype


def cast_like_projection(hidden, kernel, dtype):
    """`(hidden, kernel)` in the projection's compute dtype (unchanged when None)."""
    if dtype is None:
        return hidden, kernel
    return jnp.asarray(hidden, dtype), jnp.asarray(kernel, dtype)


def hidden_states_and_kernel(module: nn.Module, variables: dict, *args, method=None, **kwargs):
    """`(hidden, kernel)`: `module.apply(variables, *args, **kwargs)`'s output computed up
    to, not through, its logits projection, and that projection's kernel `[d_model, vocab]`,
    both in the dtype the projection computes in (see `projection_kernel` for the errors)."""
    with projection_skipped() as heads:
        hidden = module.apply(variables, *args, method=method, **kwargs)
    kernel, dtype = projection_kernel(variables["params"], heads)
    return cast_like_projection(hidden, kernel, dtype)
