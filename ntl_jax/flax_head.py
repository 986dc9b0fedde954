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

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

LOGITS_MODULE = "logits_dense"


def _param(params: Any, path: tuple[str, ...], name: str):
    node = params
    for key in path + (name,):
        node = node[key]
    return node


def hidden_states_and_kernel(module: nn.Module, variables: dict, *args, method=None, **kwargs):
    """`(hidden, kernel)`: `module.apply(variables, *args, **kwargs)`'s output computed up
    to, not through, its logits projection, and that projection's kernel `[d_model, vocab]`.

    Raises:
      ValueError: when the network calls neither a `logits_dense` module nor
        `Embed.attend`, or more than one of them.
    """
    heads = []

    def skip_projection(next_fun, fun_args, fun_kwargs, context):
        is_dense = context.module.name == LOGITS_MODULE and context.method_name == "__call__"
        is_attend = context.method_name == "attend"
        if not (is_dense or is_attend):
            return next_fun(*fun_args, **fun_kwargs)
        heads.append((tuple(context.module.scope.path), "kernel" if is_dense else "embedding"))
        return fun_args[0]

    with nn.intercept_methods(skip_projection):
        hidden = module.apply(variables, *args, method=method, **kwargs)
    if len(heads) != 1:
        raise ValueError(
            f"expected the network to compute its logits with one '{LOGITS_MODULE}' module or one "
            f"Embed.attend call, found {len(heads)}: {heads}"
        )
    path, name = heads[0]
    kernel = _param(variables["params"], path, name)
    if name == "embedding":
        kernel = jnp.transpose(kernel)
    return hidden, kernel
