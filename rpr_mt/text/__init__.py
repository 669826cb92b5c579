"""Plain text, below every other package: sentence segmenting, Multi30k's Moses tokenizing and detokenizing, and the
guesses of whether text is raw or Multi30k's tokenized text. Imports no other rpr_mt module (tests/test_imports.py),
so decoding, scoring and data preparation can all use it without depending on each other."""
