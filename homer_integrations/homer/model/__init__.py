"""The decoder, split where HOMER prunes.

Takes a transformers causal LM; gives ``DecoderStack`` (its embeddings, layers and head, run layer by
layer with HOMER's hooks between attention and the MLP), one ``Family`` per supported architecture
(``architectures/``), and stable fingerprints of weights and texts for calibration and cache keys.
"""
