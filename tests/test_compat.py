"""What ntl_jax reads from JAX and Flax beyond their plainest public API, checked on the
installed versions: the reaches in src/ntl_jax/_core/compat.py (the mesh of `with mesh:`, the
`pytree=` of an NNX head's class, and `jax.core.Tracer`, which `is_traced` reads).
Each failure names the installed versions, so a release that moves what is read is seen
here rather than deep inside a training step."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax._core import compat


def _versions():
    import jaxlib

    text = f"JAX {jax.__version__} (jaxlib {jaxlib.__version__})"
    try:
        import flax
    except ImportError:
        return text
    return f"{text}, Flax {flax.__version__}"


def _broken(what, error):
    pytest.fail(f"{what} no longer works with {_versions()}: {type(error).__name__}: {error}", pytrace=False)


def test_the_mesh_of_a_with_mesh_block_is_read_in_and_outside_jit():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
    seen = {}

    def traced(x):
        seen["jit"] = compat.legacy_context_mesh()
        return x

    try:
        seen["outside"] = compat.legacy_context_mesh()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # JAX deprecates `with mesh:`, T5X uses it
            with mesh:
                seen["inside"] = compat.legacy_context_mesh()
                jax.jit(traced)(jnp.zeros(2))
    except (AttributeError, ImportError, TypeError) as error:
        _broken("ntl_jax._core.compat.legacy_context_mesh (jax._src.mesh.thread_resources)", error)
    assert seen["outside"] is None, f"{_versions()}: a mesh outside any `with mesh:` block: {seen['outside']}"
    for where in ("inside", "jit"):
        assert seen[where] == mesh, (
            f"{_versions()}: `with mesh:` is no longer seen by ntl_jax._core.compat.legacy_context_mesh ({where}: "
            f"{seen[where]!r}); the vocabulary-parallel head would not find T5X's mesh"
        )


def test_jax_core_tracer_is_public_and_tells_traced_from_concrete():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            tracer = jax.core.Tracer
    except (AttributeError, DeprecationWarning) as error:
        _broken("jax.core.Tracer (ntl_jax._core.compat.is_traced)", error)
    seen = []

    def traced(x):
        seen.append((isinstance(x, tracer), not compat.is_traced(x)))
        return x

    jax.jit(traced)(jnp.zeros(2))
    jax.grad(lambda x: traced(x).sum())(jnp.zeros(2))
    assert seen == [(True, False)] * 2, f"{_versions()}: traced values are no longer jax.core.Tracer: {seen}"
    assert not compat.is_traced(jnp.zeros(2)) and not compat.is_traced(np.zeros(2)), _versions()


def _is_jax_pytree(module):
    """Whether JAX flattens `module` into children (its class is registered with
    jax.tree_util) rather than taking it as one leaf."""
    treedef = jax.tree.structure(module)
    return not (treedef.num_nodes == 1 and treedef.num_leaves == 1)


def test_the_pytree_declaration_of_an_nnx_head_is_read_and_kept_by_its_skipped_class():
    nnx = pytest.importorskip("flax.nnx")
    from ntl_jax.flax import _nnx

    class PlainLinear(nnx.Linear, pytree=False):
        pass

    class PlainEmbed(nnx.Embed, pytree=False):
        pass

    rngs = nnx.Rngs(0)
    heads = [nnx.Linear(4, 3, rngs=rngs), PlainLinear(4, 3, use_bias=False, rngs=rngs),
             nnx.Embed(5, 4, rngs=rngs), PlainEmbed(5, 4, rngs=rngs)]
    for index, head in enumerate(heads):
        cls = type(head)
        declared = compat.nnx_declared_pytree(cls)
        if declared is None:
            _broken("ntl_jax._core.compat.nnx_declared_pytree (Flax's _pytree__is_pytree)",
                    AttributeError(f"{cls.__name__} has no _pytree__is_pytree"))
        assert declared is _is_jax_pytree(head), (
            f"{_versions()}: ntl_jax._core.compat.nnx_declared_pytree reads pytree={declared} for {cls.__name__}, "
            f"but JAX {'does not flatten' if declared else 'flattens'} its instances"
        )
        try:
            skipped = _nnx._skipped_class(cls, index, _nnx.flax_projection(head))
        except TypeError as error:
            _broken(f"ntl_jax.flax._nnx's subclass of {cls.__name__} (pytree={declared})", error)
        object.__setattr__(head, "__class__", skipped)
        try:
            kept = (compat.nnx_declared_pytree(skipped), _is_jax_pytree(head))
        finally:
            object.__setattr__(head, "__class__", cls)
        assert kept == (declared, declared), f"{_versions()}: {cls.__name__} pytree={declared}, its skipped {kept}"
    assert [compat.nnx_declared_pytree(type(h)) for h in heads] == [True, False, True, False], _versions()


def test_a_head_declared_no_pytree_is_skipped_and_restored_under_nnx_jit():
    nnx = pytest.importorskip("flax.nnx")
    from ntl_jax.flax import _nnx

    class PlainLinear(nnx.Linear, pytree=False):
        pass

    class Tiny(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(7, 4, rngs=rngs)
            self.lm_head = PlainLinear(4, 7, rngs=rngs)

        def __call__(self, tokens):
            return self.lm_head(jnp.tanh(self.embed(tokens)))

    model, tokens = Tiny(nnx.Rngs(0)), jnp.array([[1, 2, 3]])
    for call in (_nnx.hidden_states_and_kernel,
                 nnx.jit(lambda m, t: _nnx.hidden_states_and_kernel(m, t, head="lm_head"))):
        hidden, kernel = call(model, tokens)
        assert type(model.lm_head) is PlainLinear, _versions()
        np.testing.assert_allclose(hidden @ kernel, model(tokens), atol=1e-6, err_msg=_versions())
