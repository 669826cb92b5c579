"""Model components: position tables, relation-aware attention and the encoder-decoder Transformer."""
