"""Tiny KerasHub tokenizers and `CausalLM`s built in memory, nothing downloaded: Gemma's
SentencePiece (single digits), Llama 3's byte-pair (digits in groups of up to three) and
Qwen's byte-pair (single digits), as KerasHub's own tests build theirs (a SentencePiece
model trained on a few lines, a byte-pair vocabulary and merges written out)."""

from __future__ import annotations

import io

import keras_hub
import sentencepiece

# The multiplication questions the models read, as the guide's.
LINES = [f"What is {a} * {b}? {a * b}" for a in range(3, 100, 7) for b in range(2, 40, 9)]

# Byte-level pieces (GPT-2's alphabet: Ġ is a space) that write LINES.
_CHARACTERS = ["W", "h", "a", "t", "Ġ", "i", "s", "*", "?", "Ġ*"]
_WORDS = ["Wh", "Wha", "What", "Ġi", "Ġis"]
_WORD_MERGES = ["W h", "Wh a", "Wha t", "Ġ i", "Ġi s", "Ġ *"]
_DIGITS = list("0123456789")
# Llama 3 writes up to three digits as one token: "0"-"999" (here a few of them).
_GROUPS = ["12", "10", "100", "99", "999", "36", "07"]
_GROUP_MERGES = ["1 2", "1 0", "10 0", "9 9", "99 9", "3 6", "0 7"]


def gemma_tokenizer(*, digits: bool = True) -> keras_hub.models.GemmaTokenizer:
    """A SentencePiece tokenizer trained on LINES, splitting digits as Gemma's (without
    `digits`: trained on the questions' words only, so no piece is a number)."""
    lines = LINES if digits else [line.split("?")[0].rstrip("0123456789 *") for line in LINES]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=48, hard_vocab_limit=False, model_type="bpe",
        split_digits=True, pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="<pad>", bos_piece="<bos>",
        eos_piece="<eos>", unk_piece="<unk>", minloglevel=2)
    return keras_hub.models.GemmaTokenizer(proto=model.getvalue())


def _vocabulary(special, pieces):
    return {piece: i for i, piece in enumerate(special + pieces)}


def llama3_tokenizer(*, digits: bool = True) -> keras_hub.models.Llama3Tokenizer:
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pieces = _CHARACTERS + _WORDS + (_DIGITS + _GROUPS if digits else [])
    merges = _WORD_MERGES + (_GROUP_MERGES if digits else [])
    return keras_hub.models.Llama3Tokenizer(vocabulary=_vocabulary(special, pieces), merges=merges)


def qwen_tokenizer(*, digits: bool = True) -> keras_hub.models.QwenTokenizer:
    pieces = _CHARACTERS + _WORDS + (_DIGITS if digits else [])
    return keras_hub.models.QwenTokenizer(vocabulary=_vocabulary(["<|endoftext|>"], pieces), merges=_WORD_MERGES)


def causal_lm(family: str, *, sequence_length: int = 16, seed: int = 0):
    """`(causal_lm, tokenizer)`: a one-layer `CausalLM` of `family` ("gemma", "llama3",
    "qwen") with random weights and its preprocessor."""
    tokenizer = {"gemma": gemma_tokenizer, "llama3": llama3_tokenizer, "qwen": qwen_tokenizer}[family]()
    size = tokenizer.vocabulary_size()
    import keras

    keras.utils.set_random_seed(seed)
    if family == "gemma":
        backbone = keras_hub.models.GemmaBackbone(vocabulary_size=size, num_layers=1, num_query_heads=2,
                                                  num_key_value_heads=1, hidden_dim=16, intermediate_dim=32, head_dim=8)
        preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
        return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor), tokenizer
    if family == "llama3":
        backbone = keras_hub.models.Llama3Backbone(vocabulary_size=size, num_layers=1, num_query_heads=2,
                                                   num_key_value_heads=1, hidden_dim=16, intermediate_dim=32)
        preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
        return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor), tokenizer
    backbone = keras_hub.models.QwenBackbone(vocabulary_size=size, num_layers=1, num_query_heads=2,
                                             num_key_value_heads=1, hidden_dim=16, intermediate_dim=32)
    preprocessor = keras_hub.models.QwenCausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    return keras_hub.models.QwenCausalLM(backbone=backbone, preprocessor=preprocessor), tokenizer
