"""SeqIO integration (needs seqio and TensorFlow: the `seqio` extra).

- vocabularies whose number tokens are single digits: the shipped SentencePiece model
  (`sentencepiece_vocabulary`), bytes (`byte_vocabulary`), and any vocabulary made to
  split digits (`DigitSplitVocabulary`);
- `ntl_jax.seqio.tasks`: the DeepMind mathematics tasks, registered on import;
- `ntl_jax.seqio.paper_tasks`: GSM8K, rJokes and MultiRC, registered on import.
"""

from ntl_jax.seqio.vocabularies import DigitSplitVocabulary, byte_vocabulary, output_features, sentencepiece_vocabulary

__all__ = ["DigitSplitVocabulary", "byte_vocabulary", "output_features", "sentencepiece_vocabulary"]
