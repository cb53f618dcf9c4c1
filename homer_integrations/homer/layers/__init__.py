"""One node of the merge tree through its layers.

``schedule``: which decoder layers each level of the tree runs (paper, section 3); ``nodes``: the
settings and state a compression's passes share, and ``Nodes``, which runs a node's layers, scores it
and prunes it.
"""
