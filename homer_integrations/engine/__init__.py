"""The engine: ``HomerModel`` (``model``), the one object that owns a model, its tokenizer and its document cache.

``loading`` finds and loads models (``dtypes``, ``quantization``); ``prompting`` renders and bounds the
texts around a document and ``prompt_split`` finds the document in a chat prompt; ``modes`` holds one
unit per way of keeping a document (``shared``, ``query_aware``, ``full``); ``tiers`` keys, looks up and
computes a document's entries (``builder``); ``answering`` decodes after them; ``pool`` shares one engine
per model in a process; ``aio`` drives its iterators from asyncio.
"""
