"""Fixed number encodings added to a T5-style network's input embeddings: the
Regression Transformer's, as the paper's authors train it (`T5RegressionModelRT` with
`log_scale_embeddings`, tum-ai/number-token-loss).

Their RT adds to the shared input embedding of each RT token `_d_p_` a fixed vector of
its value d * 10^p (`ntl_jax.data.rt_vocabulary.RtVocabulary.float_encodings`), in the
encoder and in the decoder; the logits (tied or not) stay the token embeddings'.

`RtFloatEncodings` does this for any network with T5X's interface whose input
embedding is a module named `token_embedder` (ours, `ntl_jax.train.network`, and
T5X's `t5x.examples.t5.network`): put it first among the bases,
`class RtTransformer(RtFloatEncodings, network.Transformer)`. The parameters are the
network's own; the encodings are constants.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

EMBEDDER = "token_embedder"
_ACTIVE = contextvars.ContextVar("ntl_jax_number_encodings_active", default=False)


@contextlib.contextmanager
def added_to_embeddings(table):
    """Within this context, the `token_embedder` module's lookup of ids returns its
    embedding plus `table[ids]` (`table` `[vocab, emb_dim]`), in the embedding's dtype.

    Nested contexts add the outermost table once: a method that calls another wrapped
    method adds it once.
    """
    if _ACTIVE.get():
        yield
        return

    def add(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.module.name == EMBEDDER and context.method_name == "__call__":
            ids = args[0] if args else kwargs["inputs"]
            extra = jnp.take(jnp.asarray(table), ids.astype(jnp.int32), axis=0)
            out = (out.astype(jnp.float32) + extra).astype(out.dtype)
        return out

    token = _ACTIVE.set(True)
    try:
        with nn.intercept_methods(add):
            yield
    finally:
        _ACTIVE.reset(token)


@functools.lru_cache(maxsize=8)
def _rt_table(emb_dim: int, rows: int) -> np.ndarray:
    from ntl_jax.data import rt_vocabulary

    return rt_vocabulary.vocabulary().float_encodings(emb_dim, rows)


class RtFloatEncodings:
    """Mixin for a Linen network with T5X's interface (`config.emb_dim`,
    `config.vocab_size`, a `token_embedder`): its `encode`, `decode` and `__call__` see
    the RT vocabulary's float encodings added to their input embeddings.

    The network's vocabulary must be the RT vocabulary (`ntl_jax.data.rt_vocabulary`,
    `ntl_jax.seqio.rt_vocabulary()`), its ids those of the table.
    """

    def rt_float_encodings(self) -> np.ndarray:
        """The `[vocab_size, emb_dim]` table this network adds."""
        return _rt_table(int(self.config.emb_dim), int(self.config.vocab_size))

    def encode(self, *args, **kwargs):
        with added_to_embeddings(self.rt_float_encodings()):
            return super().encode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        with added_to_embeddings(self.rt_float_encodings()):
            return super().decode(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with added_to_embeddings(self.rt_float_encodings()):
            return super().__call__(*args, **kwargs)
