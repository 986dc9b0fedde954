"""Memory and HBM traffic of an EasyDeL causal LM's loss head on a TPU v5e: EasyDeL's own
chunked cross-entropy against `ntl_jax.easydel`'s, CE + NTL through the fused head.

Both start where EasyDeL's loss strategies start, from the last hidden states
`[B, L, d_model]` and the head's kernel `[d_model, V]` (bf16, an untied head), with the
labels and attention mask `[B, L]`; each program is `jax.value_and_grad` of the loss with
respect to the hidden states and the kernel, compiled ahead of time for one v5e chip
(libtpu's compiler, no TPU; `tpu_cost.measure`) and never run:

- `easydel chunked`: EasyDeL's `causal_lm_loss_chunked_lm_head` (what its
  `CausalLMLossStrategy` computes once a chunk size is set: the logits projected and
  their CE computed a token chunk at a time, each chunk rematerialised in the backward
  pass), its head the model's bf16 projection (`einsum(hidden, kernel)`, as its linear
  layer's `native_forward` computes it), EasyDeL's default `LossConfig()`, the token
  chunk its own resolver picks (`auto`) or a given one;
- `ntl_jax CE`: `ntl_jax.fused_cross_entropy_and_ntl(..., number_loss=None)`, the fused
  head's cross-entropy alone;
- `ntl_jax CE + NTL-WAS`: the same with `number_loss="was"` (weight 0.3, its own), as
  `NumberLossStrategy.compute` calls it: the next-token targets `labels[:, 1:]`, the
  shifted attention mask as weights, normalised by their sum; digit-level number tokens
  (what `ntl_jax.easydel.use` reads from a tokenizer by default);
  `device_kind="TPU v5 lite"`.

Read from the compiled program: `peak` = arguments + outputs + temporaries - aliased
bytes (`memory_analysis()`, per chip, HBM), and `bytes` = `cost_analysis()["bytes
accessed"]` with each `while` body counted once per trip (`tpu_cost.loop_bytes`; XLA
counts a body once whatever its trips; on the CPU, `--micro`'s check, XLA's figure).

    python benchmarks/easydel_memory.py --out benchmarks/results/easydel_memory_v5e.json
    python benchmarks/easydel_memory.py --micro --platform cpu   # seconds, on the CPU

Needs EasyDeL (the `easydel` extra) and, for `--platform tpu`, libtpu matched to its jax
(`pip install libtpu==0.0.37` for jax 0.9.2).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

os.environ.setdefault("ENABLE_DISTRIBUTED_INIT", "0")  # EasyDeL's import otherwise starts it

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import tpu_cost  # noqa: E402

# d_model and vocabulary of the heads (Llama-3-8B's and Qwen3-8B's, both untied).
HEADS = {"llama3-8b": (4096, 128_256), "qwen3-8b": (4096, 151_936)}
MICRO_HEADS = {"micro": (64, 1024)}
BATCH, LENGTH = 2, 4096  # sequences x tokens per chip
MICRO_BATCH, MICRO_LENGTH = 2, 64
DEVICE_KIND = "TPU v5 lite"
CHUNKS = (None, 1024)  # EasyDeL's token chunk: its resolver's choice, and one given
MICRO_CHUNKS = (None, 16)


def number_tokens(vocab: int):
    """Digit-level number tokens of a vocabulary of `vocab` ids, the digits at ids 15-24
    (Qwen's; where they sit changes no memory)."""
    import ntl_jax

    pieces = [f"w{i}" for i in range(vocab)]
    for digit in range(10):
        pieces[15 + digit] = str(digit)
    return ntl_jax.NumberTokens.from_pieces(pieces)


def easydel_loss(token_chunk_size: int | None):
    from easydel.infra.loss_utils import LossConfig, causal_lm_loss_chunked_lm_head

    def loss(hidden, kernel, labels, mask):
        metrics = causal_lm_loss_chunked_lm_head(
            hidden, labels, lambda h: jnp.einsum("...ik,...kj->...ij", h, kernel), vocab_size=kernel.shape[1],
            attention_mask=mask, config=LossConfig(), token_chunk_size=token_chunk_size)
        return metrics.loss

    return loss


def easydel_chunk(batch: int, length: int, vocab: int, token_chunk_size: int | None) -> int:
    """The token chunk EasyDeL's loss runs with (its resolver caps a given one)."""
    from easydel.infra.loss_utils import LossConfig, resolve_causal_lm_chunk_token_size

    hidden = jax.ShapeDtypeStruct((batch, length - 1, 1), jnp.bfloat16)
    chunk = resolve_causal_lm_chunk_token_size(hidden, vocab, LossConfig())
    return chunk if token_chunk_size is None else min(token_chunk_size, chunk)


def ntl_loss(vocab: int, number_loss, device_kind: str | None):
    import ntl_jax

    numbers = number_tokens(vocab)

    def loss(hidden, kernel, labels, mask):
        weights = mask[:, 1:].astype(jnp.float32)
        targets = jnp.where(labels[:, 1:] == -100, -1, labels[:, 1:])
        factor = jnp.maximum(jnp.sum(weights), 1.0)
        return ntl_jax.fused_cross_entropy_and_ntl(
            hidden[:, :-1], kernel, targets, numbers, weights=weights, number_loss=number_loss,
            loss_normalizing_factor=factor, device_kind=device_kind)[0]

    return loss


def arguments(batch: int, length: int, d_model: int, vocab: int, sharding):
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    return (spec((batch, length, d_model), jnp.bfloat16), spec((d_model, vocab), jnp.bfloat16),
            spec((batch, length), jnp.int32), spec((batch, length), jnp.int32))


def argument_bytes(batch: int, length: int, d_model: int, vocab: int) -> int:
    """What the arguments hold: hidden and kernel in bf16, labels and mask in int32."""
    return 2 * batch * length * d_model + 2 * d_model * vocab + 2 * 4 * batch * length


def variants(batch: int, length: int, vocab: int, chunks, device_kind) -> dict:
    out = {}
    for chunk in chunks:
        used = easydel_chunk(batch, length, vocab, chunk)
        name = f"easydel chunked ({'auto' if chunk is None else 'given'}: {used} tokens)"
        out[name] = easydel_loss(chunk)
    out["ntl_jax CE"] = ntl_loss(vocab, None, device_kind)
    out["ntl_jax CE + NTL-WAS"] = ntl_loss(vocab, "was", device_kind)
    return out


def measure_rows(heads: dict, batch: int, length: int, chunks, target: str, log=print) -> list[dict]:
    sharding = (tpu_cost.one_chip() if target == "tpu"
                else jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0]))
    device_kind = DEVICE_KIND if target == "tpu" else None
    rows = []
    for head, (d_model, vocab) in heads.items():
        args = arguments(batch, length, d_model, vocab, sharding)
        for name, loss in variants(batch, length, vocab, chunks, device_kind).items():
            cost = tpu_cost.measure(jax.value_and_grad(loss, argnums=(0, 1)), args, per_trip=target == "tpu")
            row = {"head": head, "d_model": d_model, "vocab": vocab, "variant": name, "peak": cost.peak,
                   "temp": cost.temp, "argument": cost.argument, "output": cost.output, "alias": cost.alias,
                   "bytes": cost.bytes, "bytes_counted_once": cost.bytes_counted_once,
                   "loops": [{k: v for k, v in loop.items()} for loop in cost.loops],
                   "compile_s": round(cost.compile_s, 1)}
            rows.append(row)
            log(f"{head:10} {name:38} peak {cost.peak / 2**30:6.2f} GiB (temp {cost.temp / 2**30:5.2f}) "
                f"bytes {cost.bytes / 2**30:7.2f} GiB  [{cost.compile_s:.0f} s]")
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro", action="store_true", help="a tiny head, batch and length (a quick check)")
    parser.add_argument("--platform", default="tpu", choices=["tpu", "cpu"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    heads = MICRO_HEADS if args.micro else HEADS
    batch, length = (MICRO_BATCH, MICRO_LENGTH) if args.micro else (BATCH, LENGTH)
    rows = measure_rows(heads, batch, length, MICRO_CHUNKS if args.micro else CHUNKS, args.platform)
    from importlib import metadata

    result = {"command": "python benchmarks/easydel_memory.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "date": datetime.date.today().isoformat(), "jax": jax.__version__,
              "easydel": metadata.version("easydel"), "machine": platform.machine(),
              "target": "TPU v5e, one chip (v5e:2x2), ahead of time" if args.platform == "tpu" else "host CPU",
              "libtpu": _version("libtpu") if args.platform == "tpu" else None,
              "batch": batch, "length": length, "dtype": "bfloat16", "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
