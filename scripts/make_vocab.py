#!/usr/bin/env python
"""Regenerates src/ntl_jax/data/vocab_assets/ntl_math.model, the shipped SentencePiece vocabulary.

A BPE model trained on generated DeepMind mathematics text (questions and answers
of every module, all five release folders) with `split_digits=True` and the ten digits
as fixed symbols, so every digit is its own token; T5's special ids (pad 0, eos 1,
unk 2, no bos); byte fallback so any text round-trips. Deterministic: fixed generation
seed, one training thread. (A unigram model segmented this text worse: "▁Wh" "at"
for "▁What", about 20 % more tokens.)

    python scripts/make_vocab.py [--per-module 60] [--vocab-size 1000] [--output PATH]
    python scripts/make_vocab.py --write-corpus corpus.txt   # keep the text
    python scripts/make_vocab.py --corpus corpus.txt         # train from kept text
"""

from __future__ import annotations

import argparse
import io
import os
import sys

DEFAULT_OUTPUT = os.path.join(os.path.dirname(__file__), "..", "src", "ntl_jax", "data", "vocab_assets",
                              "ntl_math.model")


def corpus(per_module: int, seed: int) -> list[str]:
    from ntl_jax.data import catalogue, generate

    lines = []
    jobs = [(m, r) for m in catalogue.TRAIN_MODULES for r in catalogue.TRAIN_REGIMES + ("interpolate",)]
    jobs += [(m, "extrapolate") for m in catalogue.EXTRAPOLATE_MODULES]
    for module, regime in jobs:
        for q, a in generate.iterate(module, regime, seed=seed, n=per_module):
            lines += [q, a]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-module", type=int, default=60,
                        help="pairs per module and release folder")
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12345, help="generation seed")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    parser.add_argument("--corpus", help="train from this text file instead of generating")
    parser.add_argument("--write-corpus", help="also save the generated text here")
    args = parser.parse_args(argv)

    import sentencepiece as spm

    if args.corpus:
        with open(args.corpus, encoding="utf-8") as f:
            lines = f.read().splitlines()
    else:
        lines = corpus(args.per_module, args.seed)
    if args.write_corpus:
        with open(args.write_corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    model = io.BytesIO()  # written in memory: no local path ends up in the model
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=args.vocab_size,
        model_type="bpe",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        split_digits=True,
        user_defined_symbols=list("0123456789"),
        byte_fallback=True,
        character_coverage=1.0,
        # Exact round trip of the ASCII mathematics text: no normalisation.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    with open(args.output, "wb") as f:
        f.write(model.getvalue())
    print(f"wrote {args.output} from {len(lines)} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
