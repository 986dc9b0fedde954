"""Small tokenizers built in memory, shaped like the ones of decoder-only LLMs.

No file or network is read: the byte-level BPEs are written out as vocabulary and
merges (so every id is known in advance), the SentencePiece model is trained on a few
thousand generated sentences. Each builder returns a fresh object, since adding tokens
changes a tokenizer in place.

- `llama3_style()`: byte-level BPE whose pre-tokenizer isolates runs of 1-3 digits
  (LLaMA-3's `\\p{N}{1,3}`), with every "0".."999" and every leading-zero piece
  "00".."099" as a token: 1,110 number tokens, as LLaMA-3.
- `qwen_style()`: byte-level BPE that isolates single digits (Qwen's `\\p{N}`).
- `gpt2_style()`: byte-level BPE with GPT-2's own split, so numbers carry the space
  before them (`Ġ123`).
- `sentencepiece_processor()`: a SentencePiece BPE with `▁12`-style pieces.
- `transformers_fast(tokenizer)`: a `transformers.PreTrainedTokenizerFast` around one of
  these, with added special tokens (so `len(tok) > tok.vocab_size`).
"""

from __future__ import annotations

import functools
import io
import random

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>")
LLAMA3_NUMBERS = [str(d) for d in range(10)] + [f"{n:02d}" for n in range(100)] + [f"{n:03d}" for n in range(1000)]
GPT2_EXTRA = ("12", "123", "45", "07", "Ġ1", "Ġ12", "Ġ123", "Ġ4", "Ġ45", "Ġ0", "Ġ07", "Ġ7", "Ġ*", "Ġis")


@functools.lru_cache(maxsize=None)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-unicode table: printable bytes map to themselves, the others
    (space, control bytes, ...) to the characters from U+0100 on, so a space is `Ġ`."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_vocab(extra_tokens) -> dict[str, int]:
    """The 256 byte characters at ids 0-255 (id = byte value), then `extra_tokens` in order."""
    vocab = {bytes_to_unicode()[b]: b for b in range(256)}
    for token in extra_tokens:
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


def _merges(vocab: dict[str, int], extra_tokens) -> list[tuple[str, str]]:
    """Every split of every extra token into two vocabulary tokens, shorter tokens first,
    so a token is reached whichever of its merges BPE applies first."""
    merges = []
    for token in sorted(dict.fromkeys(extra_tokens), key=len):
        merges += [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
    return merges


def byte_level_bpe(extra_tokens, *, digit_pattern: str | None, specials=SPECIAL_TOKENS):
    """A `tokenizers.Tokenizer`: a byte-level BPE over `byte_level_vocab(extra_tokens)`.

    `digit_pattern` (a regex such as `\\p{N}{1,3}`) is split off as its own pre-token
    before the byte-level split (as LLaMA-3 and Qwen do); None keeps GPT-2's split. The
    special tokens are added after the vocabulary, as LLaMA-3's.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = byte_level_vocab(extra_tokens)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=_merges(vocab, extra_tokens)))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if digit_pattern is None:
        tokenizer.pre_tokenizer = byte_level
    else:
        split = pre_tokenizers.Split(Regex(digit_pattern), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def llama3_style():
    """LLaMA-3-style: digit runs split in groups of 1-3, all of "0".."999" and "00".."099" tokens.

    Ids: byte b at id b, then "00".."99" at 256-355 ("00" 256, "42" 298), then
    "000".."999" at 356-1355 ("123" 479), then the special tokens at 1356 and 1357.
    """
    return byte_level_bpe(LLAMA3_NUMBERS, digit_pattern=r"\p{N}{1,3}")


def qwen_style():
    """Qwen-style: every digit its own token (ids 48-57, their byte values)."""
    return byte_level_bpe((), digit_pattern=r"\p{N}")


def gpt2_style():
    """GPT-2-style: numbers keep the space before them (`Ġ123`, `Ġ45`); ids of
    `GPT2_EXTRA` from 256 on, in that order."""
    return byte_level_bpe(GPT2_EXTRA, digit_pattern=None)


def transformers_fast(tokenizer, *, additional_special_tokens=("<|eot_id|>", "<|pad|>")):
    """A `transformers.PreTrainedTokenizerFast` around `tokenizer`, with two more special
    tokens added, so `len(tok)` exceeds `tok.vocab_size` by every added token."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[1])
    fast.add_special_tokens({"additional_special_tokens": list(additional_special_tokens), "pad_token": "<|pad|>"})
    return fast


def sentencepiece_sentences(count: int = 3000, seed: int = 0) -> list[str]:
    """Arithmetic questions whose small numbers recur often enough to become `▁12`-style pieces."""
    rng = random.Random(seed)
    words = ["What", "is", "the", "sum", "of", "and", "plus", "times", "minus", "Calculate", "Let", "be"]
    sentences = []
    for _ in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 999)
        sentences.append(f"{rng.choice(words)} {rng.choice(words)} {a} {rng.choice('+-*')} {b} ?")
    return sentences


def sentencepiece_processor(vocab_size: int = 400, seed: int = 0):
    """A SentencePiece BPE (`sentencepiece.SentencePieceProcessor`) trained in memory,
    digits not split, so numbers become pieces such as `▁12` and `▁7` (ids vary with
    the sentencepiece version: look them up with `piece_to_id`)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentencepiece_sentences(seed=seed)), model_writer=model, vocab_size=vocab_size,
        model_type="bpe", character_coverage=1.0, split_digits=False, num_threads=1,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())
