"""Seq2Seq's encoder output: the key-padding mask that encode prepares once and the decoder's cross-attention uses."""

from __future__ import annotations

import pytest
import torch

from rpr_mt.config import ModelConfig
from rpr_mt.model.transformer import EncoderOutput, Seq2Seq


def tiny_model() -> Seq2Seq:
    torch.manual_seed(0)
    config = ModelConfig(d_model=16, n_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=32, dropout=0.0,
                         positions="relative", max_positions=32, clip=2)
    return Seq2Seq(config, vocab_size=20, pad_id=0, bos_id=2, eos_id=3).eval()


def test_the_decoder_never_attends_to_padded_memory():
    """encode prepares the key-padding mask once and EncoderOutput carries it. A missing mask would read as "nothing
    padded", so it has no default: an output built from memory and src_mask alone is refused, and the decoder's
    states for a padded source equal those for the same source unpadded."""
    model = tiny_model()
    with pytest.raises(TypeError):
        EncoderOutput(torch.zeros(1, 2, 16), torch.ones(1, 2, dtype=torch.bool))  # type: ignore[call-arg]
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 3, 0, 0, 0]])
    tgt_in = torch.tensor([[2, 4, 5], [2, 6, 7]])
    enc = model.encode(src)
    assert enc.padded and not model.encode(src[:1]).padded  # the first source alone is not padded
    with torch.no_grad():
        padded = model.decode_hidden(tgt_in, enc)[1]
        alone = model.decode_hidden(tgt_in[1:], model.encode(src[1:, :2]))[0]
    torch.testing.assert_close(padded, alone, atol=1e-6, rtol=1e-5)
