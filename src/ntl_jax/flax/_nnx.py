"""A Flax NNX model's hidden states before its logits projection, for the fused loss.

`hidden_states_and_kernel(model, *args)` calls `model(*args)` with its output
projection returning its input, so the call returns `hidden` with `logits == hidden @
kernel`, and returns the projection's `kernel` `[d_model, vocab]` beside it:

- an `nnx.Linear` head: its kernel `[in, out]`. A bias is folded in exactly, as one more
  row of the kernel and a column of ones on `hidden` (`[h, 1] @ [[W], [b]] == h @ W + b`);
  this costs one copy of the kernel per call, so a head without bias is cheaper.
- a head tied to the token embedding, `nnx.Embed.attend`: the kernel is `embedding.T`.

Which module is the projection: the one `head` names (an attribute path such as
`"lm_head"` or `"decoder.out"`, or the module itself). By default, the model's
`lm_head` attribute when it is an `nnx.Linear` or `nnx.Embed`, and the `attend` of every
`nnx.Embed` in the model. Exactly one call of these must happen while the model runs.
Whatever linear map the model applies to the logits after the projection (a scale such
as `1/sqrt(d_model)`) lands on `hidden`, where the fused loss needs it; a nonlinear one
(soft-capping) cannot be moved before the projection and must not be there.

Linen networks are `_linen`'s; this is a module of its own because NNX modules are
stateful objects, not functions of a variables dict: the head is found as an object and
skipped by giving it, for the one call, a subclass whose projection returns its input.
An NNX transform inside the model (`nnx.remat`, `nnx.jit`) copies a module together with
its class, so the head stays skipped there too. The kernel is read from the module after
the call, so under `nnx.grad`/`jax.grad` and `jit` it is the traced parameter itself.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from ntl_jax._core import compat
from ntl_jax.flax._linen import cast_like_projection

HEAD_ATTRIBUTE = "lm_head"


@dataclasses.dataclass(frozen=True)
class Projection:
    """How a head class computes logits from hidden states: `method(hidden)` returns
    `inputs(module, hidden) @ kernel(module)`. `inputs` returns `hidden` as the projection
    multiplies it (cast to its compute dtype; a column of ones for a bias, which `kernel`
    carries as its last row); `kernel` returns `[d_model, vocab]`."""

    method: str
    inputs: Callable[[Any, jax.Array], jax.Array]
    kernel: Callable[[Any], jax.Array]


def _linear_inputs(module: nnx.Linear, inputs):
    bias = module.bias[...] if module.bias is not None else None
    inputs, _, bias = module.promote_dtype((inputs, module.kernel[...], bias), dtype=module.dtype)
    if bias is None:
        return inputs
    return jnp.concatenate([inputs, jnp.ones(inputs.shape[:-1] + (1,), inputs.dtype)], axis=-1)


def _linear_kernel(module: nnx.Linear):
    kernel = module.kernel[...]
    if module.bias is None:
        return kernel
    return jnp.concatenate([kernel, jnp.asarray(module.bias[...], kernel.dtype)[None, :]], axis=0)


def _attend_inputs(module: nnx.Embed, query):
    query, _ = module.promote_dtype((query, module.embedding[...]), dtype=module.dtype)
    return query


LINEAR = Projection("__call__", _linear_inputs, _linear_kernel)
ATTEND = Projection("attend", _attend_inputs, lambda module: jnp.transpose(module.embedding[...]))


def flax_projection(module: Any) -> Projection | None:
    """Flax's heads: an `nnx.Linear`, and an `nnx.Embed`'s `attend` (tied logits)."""
    if isinstance(module, nnx.Linear):
        return LINEAR
    if isinstance(module, nnx.Embed):
        return ATTEND
    return None


# The projection calls seen in the running `hidden_states_through`, as
# `(index of the head, compute dtype)`; None outside it.
_CALLS: contextvars.ContextVar[list | None] = contextvars.ContextVar("ntl_jax_nnx_head_calls", default=None)
_SKIPPED_CLASSES: dict[tuple[type, int, Projection], type] = {}


def _skipped_class(cls: type, index: int, projection: Projection) -> type:
    """The subclass of `cls` whose projection records `index` and returns its input as
    the projection multiplies it. Cached: a class per (head class, index, projection),
    never one per call."""
    key = (cls, index, projection)
    if key in _SKIPPED_CLASSES:
        return _SKIPPED_CLASSES[key]
    original = getattr(cls, projection.method)

    def skipped(self, inputs, *args, **kwargs):
        calls = _CALLS.get()
        if calls is None:  # not within hidden_states_through: behave as the head
            return original(self, inputs, *args, **kwargs)
        inputs = projection.inputs(self, inputs)
        calls.append((index, inputs.dtype))
        return inputs

    body = {projection.method: skipped, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    # The subclass is declared a pytree or not as the head's class is (Flax's default otherwise).
    pytree = compat.nnx_declared_pytree(cls)
    keywords = {} if pytree is None else {"pytree": pytree}
    _SKIPPED_CLASSES[key] = types.new_class(cls.__name__, (cls,), keywords, lambda ns: ns.update(body))
    return _SKIPPED_CLASSES[key]


def module_names(model: nnx.Module) -> dict[int, str]:
    """Each module of `model` by `id`, named by its attribute path, for error messages."""
    return {id(node): ".".join(map(str, path)) or "<the model>" for path, node in nnx.iter_graph(model)}


def describe(module: Any, projection: Projection, names: dict[int, str]) -> str:
    """`path (Class.method)`: where a head sits in the model and what computes its logits."""
    name = names.get(id(module), "<not in the model>")
    method = "" if projection.method == "__call__" else f".{projection.method}"
    return f"{name} ({type(module).__name__}{method})"


def _module_at(model: nnx.Module, path: str) -> Any:
    node = model
    for part in path.split("."):
        try:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            raise ValueError(
                f"expected head to be an attribute path of the model naming its logits projection, got {path!r} "
                f"(no {part!r} in {type(node).__name__})"
            ) from None
    return node


def _heads(model: nnx.Module, head: str | nnx.Module | None) -> list[tuple[nnx.Module, Projection]]:
    """The modules whose projection calls count, in order, each once."""
    if head is None:
        named = getattr(model, HEAD_ATTRIBUTE, None)
        heads = [named] if isinstance(named, (nnx.Linear, nnx.Embed)) else []
        heads += [node for _, node in nnx.iter_graph(model) if isinstance(node, nnx.Embed)]
    else:
        module = _module_at(model, head) if isinstance(head, str) else head
        if not isinstance(module, (nnx.Linear, nnx.Embed)):
            raise TypeError(
                f"expected head to name an nnx.Linear or nnx.Embed (tied logits through attend), "
                f"got {type(module).__name__}"
            )
        heads = [module]
    unique = {id(m): m for m in heads}
    return [(m, flax_projection(m)) for m in unique.values()]


def hidden_states_through(call: Callable[[], Any], heads: list[tuple[Any, Projection]], names: dict[int, str],
                          expected: str, hint: str = ""):
    """`(hidden, kernel)`: what `call()` returns with each head's projection returning
    its input, and the kernel of the one head it called, both in the dtype the projection
    computes in. The heads are left as they were, also when the call raises.

    Raises:
      ValueError: the call used the heads' projections other than once, or it returned
        something other than the projection's output (`[..., vocab]`).
    """
    calls: list = []
    classes = [type(m) for m, _ in heads]
    token = _CALLS.set(calls)
    try:
        for index, (module, projection) in enumerate(heads):
            object.__setattr__(module, "__class__", _skipped_class(type(module), index, projection))
        hidden = call()
    finally:
        for (module, _), cls in zip(heads, classes):
            object.__setattr__(module, "__class__", cls)
        _CALLS.reset(token)
    if len(calls) != 1:
        raise ValueError(
            f"expected the model to compute its logits with exactly one call of {expected}, "
            f"got {len(calls)} calls{hint}"
        )
    index, dtype = calls[0]
    module, projection = heads[index]
    kernel = projection.kernel(module)
    width = kernel.shape[0]
    if not isinstance(hidden, jax.Array) or hidden.ndim < 1 or hidden.shape[-1] != width:
        got = f"shape {hidden.shape}" if hasattr(hidden, "shape") else type(hidden).__name__
        raise ValueError(
            f"expected the model to return its logits, so that with {describe(module, projection, names)} "
            f"skipped it returns [..., {width}] hidden states, got {got}"
        )
    return cast_like_projection(hidden, kernel, dtype)


def hidden_states_and_kernel(model: nnx.Module, *args, head: str | nnx.Module | None = None,
                             method: str | Callable | None = None, **kwargs):
    """`(hidden, kernel)`: the model's output computed up to, not through, its logits
    projection, and that projection's kernel `[d_model, vocab]` (see the module
    docstring), both in the dtype the projection computes in.

    Args:
      model: the `nnx.Module`; it is left as it was, also when the call raises.
      *args, **kwargs: the call's arguments.
      head: the projection: an attribute path (`"lm_head"`, `"decoder.layers.3"`) or the
        module, an `nnx.Linear` or an `nnx.Embed` (its `attend`). None: `lm_head` when the
        model has one, and every `nnx.Embed`'s `attend`.
      method: what to call instead of `model(...)`: a method name, or a function called
        as `method(model, *args, **kwargs)`.

    Raises:
      TypeError: `model` is no `nnx.Module`, or `head` names no `nnx.Linear`/`nnx.Embed`.
      ValueError: `head` names nothing, the model called the projection other than once,
        or it returned something other than the projection's output (`[..., vocab]`).

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> class Tiny(nnx.Module):
      ...     def __init__(self, rngs):
      ...         self.embed = nnx.Embed(7, 4, rngs=rngs)
      ...         self.lm_head = nnx.Linear(4, 7, use_bias=False, rngs=rngs)
      ...     def __call__(self, tokens):
      ...         return self.lm_head(jnp.tanh(self.embed(tokens)))
      >>> model = Tiny(nnx.Rngs(0))
      >>> tokens = jnp.array([[1, 2, 3]])
      >>> hidden, kernel = hidden_states_and_kernel(model, tokens)
      >>> hidden.shape, kernel.shape
      ((1, 3, 4), (4, 7))
      >>> bool(jnp.allclose(hidden @ kernel, model(tokens), atol=1e-6))
      True
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"expected an nnx.Module, got {type(model).__name__} "
                        "(Linen networks: linen_hidden_states_and_kernel)")
    heads = _heads(model, head)
    names = module_names(model)
    expected = " or ".join(describe(m, p, names) for m, p in heads) or (
        f"an nnx.Linear attribute '{HEAD_ATTRIBUTE}' or an nnx.Embed's attend (the model has neither)"
    )
    if isinstance(method, str):
        call = getattr(model, method)
    elif method is not None:
        call = functools.partial(method, model)
    else:
        call = model
    return hidden_states_through(lambda: call(*args, **kwargs), heads, names, expected,
                                 hint="; name the projection with head=")
