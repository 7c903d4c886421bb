"""How hits are found: text normalisation and lexical terms, embedders, the hybrid query.

`tokenization` turns text into the terms the full-text index stores (CJK aware);
`embedders` turns text into vectors through a named, pluggable backend.
"""
