"""What a question reads: the kept root, its own replayed root, or passages re-read past the window.

``strategies``: how ``HomerConfig`` is built (the shared root's builder, the per-question replay);
``passages``: a document's statements grouped into passages and ranked; ``budget``: how many tokens
a question re-reads past the model's window.
"""
