"""Data files of ntl_jax.data.vocabulary (the shipped SentencePiece model)."""
