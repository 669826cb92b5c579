"""rpr-mt: encoder-decoder Transformers with relative position representations (Shaw et al., 2018)."""

__version__ = "0.1.0"
