"""The fused head's Pallas backward (`backward="pallas"`), in Pallas' interpret mode on
the CPU, against the unfused objective and a plain product of the logits' gradient."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntl_jax import fused_cross_entropy_and_ntl, losses
from ntl_jax._core import fused_pallas
from tests import test_fused
from tests.objective_options import OPTIONS
from tests.test_fused import NT, NT_WIDE, _assert_same, _inputs, _packed, run_on_eight_cpu_devices

# The kernels' blocks are multiples of 128 columns: 69 columns are one partial block.
_CHOSEN = ["was", "number_level", "smoothing-z", "was_cdf-gce", "dist2-smoothing", "ce"]


def _both(hidden, kernel, targets, **kwargs):
    """`test_fused._both` with the Pallas backward, interpreted."""
    return test_fused._both(hidden, kernel, targets, fused_only={"backward": "pallas_interpret"}, **kwargs)


@pytest.mark.parametrize("name", _CHOSEN)
def test_the_pallas_backward_equals_the_unfused_objective(name):
    hidden, kernel, targets, weights = _inputs()
    _assert_same(*_both(hidden, kernel, targets, weights=weights, **OPTIONS[name]))


def test_with_number_tokens_beyond_digits_and_packed_sequences():
    hidden, kernel, targets, weights = _inputs(seed=3)
    _assert_same(*_both(hidden, kernel, targets, number_tokens=NT_WIDE, weights=weights,
                        number_loss=losses.was(reweigh=True), loss_normalizing_factor="AVERAGE_PER_SEQUENCE",
                        **_packed()))


def test_bfloat16_gradients_match_the_xla_backward():
    # Both round the logits' gradient to bf16 before the products and the kernel's
    # gradient once at the end: equal to a few bf16 ulps of the largest value.
    hidden, kernel, targets, weights = _inputs(seed=5, dtype=jnp.bfloat16)

    def grads(backward):
        def f(h, k):
            return fused_cross_entropy_and_ntl(h, k, targets, NT, weights=weights, backward=backward)[0]

        return jax.grad(f, argnums=(0, 1))(hidden, kernel)

    pallas = grads("pallas_interpret")
    for a, b in zip(grads("xla"), pallas):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.dtype == b.dtype
        assert np.max(np.abs(a - b)) <= 2 ** -6 * np.max(np.abs(a))


@pytest.mark.parametrize("columns, kernel_columns", [(128, 128), (256, 384)])
def test_the_kernels_against_the_product_of_the_logits_gradient(columns, kernel_columns):
    # 300 columns: partial last blocks; targets off the shard's columns (-5, 304) too.
    num, d_model, width = 64, 32, 300
    keys = jax.random.split(jax.random.key(0), 8)
    h = jax.random.normal(keys[0], (num, d_model))
    kernel = jax.random.normal(keys[1], (d_model, width)) * 0.3
    ids = jnp.array([3, 17, 128, 200, 299])
    targets = jax.random.randint(keys[2], (num,), -5, width + 5)
    stats = jnp.stack([jax.random.normal(keys[3], (num,)) + 3.0, jax.random.normal(keys[4], (num,)),
                       jax.random.normal(keys[5], (num,)), 0.1 * jax.random.normal(keys[6], (num,))], axis=1)
    index = jnp.full((width,), -1, jnp.int32).at[ids].set(jnp.arange(ids.shape[0]))
    number_grad = jax.random.normal(keys[7], (d_model, ids.shape[0]))
    logits = h @ kernel
    d = (stats[:, 1:2] * jnp.exp(logits - stats[:, :1]) + stats[:, 3:4]
         + jnp.where(jnp.arange(width)[None] == targets[:, None], stats[:, 2:3], 0.0))
    d = jnp.where(index[None] < 0, d, 0.0)
    d_h, d_kernel = fused_pallas.backward(h, kernel, stats, targets, index, number_grad, columns=columns,
                                          kernel_columns=kernel_columns, interpret=True)
    np.testing.assert_allclose(d_h, d @ kernel.T, rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(d @ kernel.T))))
    expected = (h.T @ d).at[:, ids].set(number_grad)
    np.testing.assert_allclose(d_kernel, expected, rtol=0, atol=2e-6 * float(jnp.max(jnp.abs(expected))))


def test_off_a_tpu_the_pallas_backward_is_refused():
    hidden, kernel, targets, _ = _inputs()
    with pytest.raises(ValueError, match="expected a TPU for backward='pallas'.*got cpu"):
        fused_cross_entropy_and_ntl(hidden, kernel, targets, NT, backward="pallas")
    with pytest.raises(ValueError, match="expected backward 'xla', 'pallas' or 'pallas_interpret', got 'mosaic'"):
        fused_cross_entropy_and_ntl(hidden, kernel, targets, NT, backward="mosaic")


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from ntl_jax import NumberTokens, fused_cross_entropy_and_ntl
    pieces = ["<pad>", "</s>"] + [str(d) for d in range(10)] + [f"w{i}" for i in range(500)]
    nt = NumberTokens.from_pieces(pieces)
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(4, 8, 16)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(16, 512)), jnp.float32)
    targets = jnp.asarray(rng.choice(np.r_[2:12, 20, 300], size=(4, 8)), jnp.int32)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    def loss(h, k, axis, backward):
        return fused_cross_entropy_and_ntl(h, k, targets, nt, number_loss="was", vocab_axis=axis,
                                           mesh=mesh if axis else None, backward=backward)[0]
    reference = jax.value_and_grad(loss, argnums=(0, 1))(hidden, kernel, None, "xla")
    sharded = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=(2, 3))(
        jax.device_put(hidden, NamedSharding(mesh, P("data", None, None))),
        jax.device_put(kernel, NamedSharding(mesh, P(None, "model"))), "model", "pallas_interpret")
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(sharded)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a - b)) <= 2e-5 * np.max(np.abs(a)), np.max(np.abs(a - b))
    print("sharded equals unsharded")
    """
)


def test_vocabulary_and_batch_parallel_equals_unsharded():
    # 4 vocabulary shards of 128 columns, tokens split over 2 (their kernel gradient is
    # summed in float32 across them).
    assert "sharded equals unsharded" in run_on_eight_cpu_devices(SHARDED, timeout=600)


def test_blocks_fit_the_vmem_budget_or_the_error_says_what_did_not():
    # Qwen3-0.6B's head in bf16: 1,024 tokens x 512 columns, 256 tokens x 2,048 columns.
    assert fused_pallas._hidden_grad_blocks(8192, 1024, 2)[:2] == (1024, 512)
    assert fused_pallas._kernel_grad_blocks(8192, 1024, 128, 2)[:2] == (256, 2048)
    assert fused_pallas._kernel_grad_blocks(1024, 1024, 128, 2)[:2] == (256, 2048)
    # Llama-3's head with its 1,110 number tokens (padded to 1,152) in bf16 fits ...
    for blocks in (fused_pallas._hidden_grad_blocks(8192, 4096, 2),
                   fused_pallas._kernel_grad_blocks(8192, 4096, 1152, 2)):
        assert blocks[2] <= fused_pallas._VMEM_BUDGET
    # ... in float32 the number columns' gradient alone takes 36 MiB.
    with pytest.raises(ValueError, match="blocks fit 40 MiB of VMEM, got d_model 4096 and 1152 number columns"):
        fused_pallas._kernel_grad_blocks(8192, 4096, 1152, 4)
