"""The head-wise shared root: each K/V head of each layer keeps its own tokens of one budget.

HOMER's other roots keep one token set for every head and layer; this one (``strategies.HeadwiseRoot``,
the default where a model allows it) lets every (layer, K/V head) keep its own, KVzip's allocation,
in a ragged cache of a dense root's bytes. The unit, in the order a root is built and read:

- ``selection``: per-head reconstruction scores (``head_scores``) and the cuts over them
  (``survivors``, ``keep_ragged``; ``keep_per_head`` and ``keep_global`` for research).
- ``root``: building the root (``compress_headwise``) and why a model cannot hold one
  (``headwise_refusal``).
- ``cache``: the ragged cache layer (``HeadwiseLayer``, ``headwise_cache``) and the attention
  function that reads it (``HeadwiseAttention``), registered once per engine build by
  ``register_headwise_attention``.

Import each name from its part (``homer.headwise.root`` and so on); the package re-exports nothing:
``cache`` sits below the modules that store and decode documents (``compressed``, ``generation``),
``root`` above the compressors, so importing one part must not import the others.
"""
