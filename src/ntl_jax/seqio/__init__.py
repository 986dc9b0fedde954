"""SeqIO integration (needs seqio and TensorFlow: the `seqio` extra).

- vocabularies whose number tokens are single digits: the shipped SentencePiece model
  (`sentencepiece_vocabulary`), bytes (`byte_vocabulary`), and any vocabulary made to
  split digits (`DigitSplitVocabulary`); the Regression Transformer's, a token per digit
  and decimal place (`rt_vocabulary`);
- `ntl_jax.seqio.xval`: xVal's vocabulary (each number one `[NUM]` token), its number
  scales and feature converter;
- `ntl_jax.seqio.tasks`: the DeepMind mathematics tasks, registered on import;
- `ntl_jax.seqio.paper_tasks`: GSM8K, rJokes and MultiRC, registered on import.
"""

from ntl_jax.seqio.vocabularies import (
    DigitSplitVocabulary,
    RtSeqioVocabulary,
    byte_vocabulary,
    output_features,
    rt_vocabulary,
    sentencepiece_vocabulary,
)

__all__ = ["DigitSplitVocabulary", "RtSeqioVocabulary", "byte_vocabulary", "output_features", "rt_vocabulary",
           "sentencepiece_vocabulary"]
