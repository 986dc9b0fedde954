"""Data files of ntl_jax.vocab (the shipped SentencePiece model)."""
