"""Decoding after a cache: explicit positions, sampling, stop strings, streaming (``generation``), and
answers constrained to a JSON schema, a regex or a choice (``constraints``)."""
