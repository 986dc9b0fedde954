"""The one place where ntl_jax reads JAX and Flax internals, for want of a public API.

Each reach here has no public equivalent in the versions that pyproject.toml allows;
tests/test_compat.py fails, naming the installed JAX and Flax versions, when a release
moves or removes what is read.
"""

from __future__ import annotations


def legacy_context_mesh():
    """The mesh of an enclosing `with mesh:` block, or None outside one.

    `with mesh:` (deprecated by JAX in favour of `jax.set_mesh`, but still how T5X's
    partitioner enters its mesh) records the mesh only in JAX's thread resources:
    `jax.sharding.get_abstract_mesh()` (and `get_mesh()` where it exists) sees
    `jax.set_mesh`'s mesh only, and JAX has no public reader for the other.
    """
    from jax._src import mesh as mesh_lib

    physical = mesh_lib.thread_resources.env.physical_mesh
    return None if physical.empty else physical


def nnx_declared_pytree(cls: type) -> bool | None:
    """The `pytree=` an NNX class was declared with (`class Head(nnx.Linear, pytree=False)`),
    or None where Flax records none.

    A subclass must repeat it (Flax otherwise applies its default, and registers the
    subclass as a JAX pytree or not accordingly); Flax keeps it only in the private
    `_pytree__is_pytree`, with no public accessor for a class.
    """
    return getattr(cls, "_pytree__is_pytree", None)


def is_traced(x) -> bool:
    """Whether `x` is a tracer (inside `jit`, `grad`, ...), whose values Python cannot read.

    JAX has no public predicate for this; `jax.core.Tracer` is the class every tracer
    derives from, in a module JAX is moving behind `jax.extend`.
    """
    import jax

    return isinstance(x, jax.core.Tracer)
