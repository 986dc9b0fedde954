"""Question-answer pairs as Tunix's training batches, the loss on the answers only."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import jax.numpy as jnp
import numpy as np
from tunix.sft import peft_trainer, utils


def training_inputs(pairs: Sequence[tuple[str, str]], tokenizer: Any, *, batch_size: int,
                    max_length: int) -> Iterator[peft_trainer.TrainingInput]:
    """Batches of `question + answer + eos`, padded with the tokenizer's pad id to
    `max_length`, with `input_mask` on the answer and its eos: the model learns to answer,
    not to ask. The last batch may be smaller.

    Args:
      pairs: `(question, answer)` strings, such as `ntl_jax.data.multiplication.examples`.
      tokenizer: Tunix's `TokenizerAdapter` (`encode`, `eos_id`, `pad_id`).
      batch_size, max_length: the batch's shape.

    Raises:
      ValueError: a pair takes more than `max_length` tokens (nothing is cut silently).
    """
    pad, eos = tokenizer.pad_id(), tokenizer.eos_id()
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        tokens = np.full((len(chunk), max_length), pad, np.int32)
        mask = np.zeros((len(chunk), max_length), bool)
        for row, (question, answer) in enumerate(chunk):
            asked, answered = tokenizer.encode(question), tokenizer.encode(answer) + [eos]
            length = len(asked) + len(answered)
            if length > max_length:
                raise ValueError(f"expected every pair to fit in max_length={max_length} tokens, got {length} "
                                 f"for {question!r} -> {answer!r}")
            tokens[row, :length] = asked + answered
            mask[row, len(asked):length] = True
        yield peft_trainer.TrainingInput(input_tokens=tokens, input_mask=mask)


def model_input_fn(pad_id: int):
    """`PeftTrainer.with_gen_model_input_fn`'s function for batches padded with `pad_id`:
    positions and a causal attention mask over the tokens that are not padding."""

    def gen_model_input(batch: peft_trainer.TrainingInput) -> dict:
        present = jnp.asarray(batch.input_tokens) != pad_id
        return {
            "input_tokens": batch.input_tokens,
            "input_mask": batch.input_mask,
            "positions": utils.build_positions_from_mask(present),
            "attention_mask": utils.make_causal_attn_mask(present),
        }

    return gen_model_input
