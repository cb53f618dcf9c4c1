"""The merge tree over the leaves and the roots built from it (paper, section 5).

Takes a leaf tier or a document's tokens; gives a root: the document's kept K/V. ``merging``: two
pruned siblings into their parent; ``merge_tree``: the paper's tree, ``level_batch``: the same level by
level in batches; ``flat``: the selection made flat; ``recompute``: one plain prefill of the tokens a
selection kept; ``headwise``: the head-wise root; ``compressor``: the passes of one compression wired
over one ``Nodes``.
"""
