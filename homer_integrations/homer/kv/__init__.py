"""The K/V forms every stage shares.

``chunk``: a node's K/V, positions and scores while its layers run; ``dynamic``: moving K/V in and out
of transformers' ``DynamicCache``; ``compressed``: ``CompressedDocument``, a document's kept K/V with
its statistics and serial form; ``headwise``: the ragged cache of a head-wise root; ``kept``: decoding
over a kept cache at the memory-bandwidth limit.
"""
