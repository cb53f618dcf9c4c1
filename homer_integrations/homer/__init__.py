"""HOMER, the algorithm: a long document compressed into one short K/V cache, and answers decoded after it.

Knows nothing of frameworks or of the engine. Its folders are the algorithm's stages, in the order a
document flows through them; a stage imports only the stages above it and the shared helpers
(``config``, ``model``, ``kv``):

- ``config``: ``HomerConfig``, the settings every stage reads.
- ``model/``: the decoder split where HOMER prunes (one family per architecture) and the identities
  of weights and texts.
- ``kv/``: the K/V forms: a node's chunk, transformers' ``DynamicCache`` helpers, the compressed
  document, the head-wise ragged cache, and decoding attention over a kept cache.
- ``document/``: text to prompt spans (prefix, document, suffix) and the document's leaves.
- ``scoring/``: how a node rates its tokens (scorers, score units, calibration, BM25 evidence) and
  keeps the best (pruning).
- ``layers/``: one node through its layers: the layer schedule of each tree level and ``Nodes``, which
  runs a node's layers, scores it and prunes it.
- ``leaves/``: the leaf pass, run once per document into its leaf tier, and the tier's stored forms.
- ``tree/``: the merge tree over the leaves and the roots built from it (tree, flat selection,
  re-read, head-wise root), wired by ``HomerCompressor``.
- ``reading/``: what a question reads: the shared root's builder, the per-question replay, the BM25
  passages re-read past the window, and their token budget.
- ``decoding/``: decoding after a cache: positions, sampling, stop strings, constraints.
"""
