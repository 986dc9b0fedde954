"""Parity cases against ntloss 0.3.2: inputs, option grids, and the ntloss runner.

The same cases feed `tests/test_parity.py` (live against ntloss when it is installed)
and `tests/fixtures/make_ntloss_fixtures.py` (which stores ntloss's outputs, so parity
is also checked where torch is absent).
"""

from __future__ import annotations

import itertools

import numpy as np

# Digits at scattered, unsorted ids, a dot, text and multi-digit pieces; "▁4", "nan" and
# "inf" are never number tokens.
PIECES = [
    "<pad>", "</s>", "<unk>", "7", "a", "0", ".", "3", "b", "9", "1", "+", "12", "=",
    "5", "-1", "2", "▁4", "8", "3.5", "nan", "6", "07", "inf", "x", "4", " ",
]
VOCAB_SIZE = len(PIECES)
BATCH, LENGTH = 3, 14
IGNORE = -100


def pieces_ids(*tokens: str) -> list[int]:
    return [PIECES.index(t) for t in tokens]


def make_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Logits, targets (digit runs, dots inside numbers, text, ignored positions) and weights."""
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(BATCH, LENGTH, VOCAB_SIZE)) * 3).astype(np.float32)
    rows = [
        # "12.5+7=19.5" style: runs, a dot between digits, then padding.
        ["1", "2", ".", "5", "+", "7", "=", "1", "9", ".", "5", "</s>", "<pad>", "<pad>"],
        # numbers next to multi-digit pieces and text, a trailing dot, a leading dot.
        ["a", "0", "0", "7", ".", "b", ".", "3", "12", "8", "x", "6", "4", "</s>"],
        # a long run, a double dot, a piece with a prefix.
        ["9", "8", "7", "6", "5", "4", "3", "2", "1", ".", ".", "2", "▁4", "3.5"],
    ]
    targets = np.array([pieces_ids(*row) for row in rows], dtype=np.int64)
    targets[0, 12:] = IGNORE  # as ntloss's ignore_index
    weights = rng.uniform(0.0, 2.0, size=(BATCH, LENGTH)).astype(np.float32)
    weights[rng.uniform(size=(BATCH, LENGTH)) < 0.2] = 0.0
    weights[0, 12:] = 0.0
    return {"logits": logits, "targets": targets, "weights": weights}


def variants():
    """(name, kind, options) for every loss variant and option checked."""
    for digit_level, squash, reweigh in itertools.product([True, False], [None, 3.0], [False, True]):
        yield f"was_d{int(digit_level)}_s{squash}_r{int(reweigh)}", "was", dict(
            digit_level=digit_level, squash_factor=squash, reweigh=reweigh)
    for digit_level, loss, reweigh in itertools.product([True, False], ["mse", "mae", "huber"], [False, True]):
        yield f"{loss}_d{int(digit_level)}_r{int(reweigh)}", loss, dict(
            digit_level=digit_level, reweigh=reweigh)
    for float_level, reweigh in itertools.product([False, True], [False, True]):
        yield f"number_level_f{int(float_level)}_r{int(reweigh)}", "number_level", dict(
            float_level=float_level, reweigh=reweigh)


REDUCTIONS = ("none", "sum", "mean")
WEIGHTINGS = ("unweighted", "weighted")


def hf_tokenizer():
    """A word-level Hugging Face tokenizer whose vocabulary is exactly PIECES."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(PIECES)}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")


def ntloss_output(kind, options, inputs, reduction, weighting):
    """ntloss 0.3.2's value for one case, as a float64 numpy array."""
    import ntloss
    import torch
    import torch.nn.functional as F

    tokenizer = hf_tokenizer()
    opts = dict(options)
    if kind == "was":
        loss_obj = ntloss.NTLoss(tokenizer, digit_level=opts["digit_level"], reweigh=opts["reweigh"],
                                 squash_factor=opts["squash_factor"])
    elif kind == "number_level":
        loss_obj = ntloss.NumberLevelLoss(tokenizer, float_level=opts["float_level"], reweigh=opts["reweigh"])
    else:
        fn = {"mse": F.mse_loss, "mae": F.l1_loss, "huber": F.huber_loss}[kind]
        loss_obj = ntloss.NTLossDotProduct(tokenizer, digit_level=opts["digit_level"], reweigh=opts["reweigh"],
                                           loss_function=fn)
    assert loss_obj.vocab_size == VOCAB_SIZE, "ntloss must not add tokens to this vocabulary"
    targets = inputs["targets"]
    weights = None
    if weighting == "weighted":
        weights = torch.from_numpy(inputs["weights"])
        # ntl_jax ignores a weight-0 position as ntloss ignores `ignore_index`. For the
        # per-token losses that changes nothing; for the number-level loss a weight-0
        # digit then breaks its number instead of joining it (ntloss's own weights would
        # join it, and weight the whole number by its first digit's weight).
        targets = np.where(inputs["weights"] == 0, IGNORE, targets)
    out = loss_obj(torch.from_numpy(inputs["logits"]), torch.from_numpy(targets),
                   loss_weights=weights, reduction=reduction)
    return out.detach().numpy().astype(np.float64)
