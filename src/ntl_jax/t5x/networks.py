"""T5X's T5 network as the paper's baselines need it.

`XvalTransformer` is `t5x.examples.t5.network.Transformer` with xVal's scaled `[NUM]`
embeddings and number head (`ntl_jax.flax.xval`), for
`ntl_jax.t5x.xval.XvalEncoderDecoderModel` (`t5x_configs/systems/xval.gin`).

`RtTransformer` is `t5x.examples.t5.network.Transformer` with the Regression
Transformer's fixed float encodings added to the input embeddings of its number tokens,
in the encoder and the decoder, as the authors' `T5RegressionModelRT` does
(`ntl_jax.flax.number_embeddings`). Its parameters are the stock network's, so a T5X
checkpoint of the same sizes and vocabulary loads into it. Use it on the RT vocabulary
(`ntl_jax.seqio.rt_vocabulary()`): `t5x_configs/systems/rt.gin`.
"""

from __future__ import annotations

from ntl_jax.t5x._install import require_t5x

require_t5x()  # before T5X is imported: says how to install it

from t5x.examples.t5 import network  # noqa: E402

from ntl_jax.flax.number_embeddings import RtFloatEncodings  # noqa: E402
from ntl_jax.flax.xval import XvalNetwork  # noqa: E402

__all__ = ["RtTransformer", "XvalTransformer"]


class RtTransformer(RtFloatEncodings, network.Transformer):
    """`t5x.examples.t5.network.Transformer` (argument `config`, a `T5Config`) with the
    RT float encodings added to its input embeddings; on the RT vocabulary."""


class XvalTransformer(XvalNetwork, network.Transformer):
    """`t5x.examples.t5.network.Transformer` (argument `config`) with xVal's scaled input
    embeddings and number head: `(logits, numbers)` from the batch's features and
    `encoder_scale`/`decoder_scale`; the stock parameters plus `number_head`."""
