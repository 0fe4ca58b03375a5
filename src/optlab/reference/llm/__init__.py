"""The reference LLM: a small decoder-only transformer trained on text that ships with Python
(`python -m optlab.reference.llm.train`), its weights in this package, served OpenAI-compatibly
with streaming by `python -m optlab.reference.llm.server`, whose knobs (KV cache, batching,
prefix caching, chunked prefill, precision, threads) each change what the CPU does.

Importing this package does not import torch; `model`, `engine` and `server` do.
"""
