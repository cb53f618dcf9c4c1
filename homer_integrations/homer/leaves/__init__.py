"""The leaves' own layers, run once per document into its leaf tier, and the tier's stored forms.

Takes a document's leaves (``document/``) and ``Nodes``; gives ``LeafTier`` (``leaf_tier``), the
question-independent work every question's replay starts from. ``leaf_pass`` runs it (``leaf_batch``
scores all leaves in one batch); ``tier_file`` is its file form; ``leaf_entry`` and ``leaf_stash`` keep
each leaf under its content key; ``leaf_reuse`` copies leaves an edited document still holds.
"""
