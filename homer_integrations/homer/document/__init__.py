"""From text to the leaves of the merge tree.

Takes a (document, question) pair and a tokenizer; gives the prompt's token spans (``prompt``,
``encoded``: prefix / document / suffix / continuation, tokenized once per call) and the document cut
into leaves (``chunking``: even windows; ``content_split``: cuts chosen by the document's statements).
"""
