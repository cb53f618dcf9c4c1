"""How a node rates its tokens and keeps the best (paper, section 4).

Takes a node's attention queries and keys in a layer; gives scores per token and the tokens kept.
``scorers``: the hook a node calls (last-token, question attention, reconstruction); ``units``: short
steps that reshape scores after a scorer; ``chain``: one scorer and its units, what a compression
prunes by; ``calibration``: the expected logit per layer and distance; ``lexical``: BM25 evidence;
``probing``: the leaf probe's rows; ``headwise``: per-head scores and cuts; ``pruning``: the cut.
"""
