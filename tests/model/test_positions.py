import math

import pytest
import torch

from rpr_mt.model.positions.absolute import sinusoidal_positions
from rpr_mt.model.positions.shaw import relative_position_index


def test_relative_position_index_paper_example():
    idx = relative_position_index(10, 10, clip=3)
    assert idx.dtype == torch.long and idx.shape == (10, 10)
    assert idx[0].tolist() == [3, 4, 5, 6, 6, 6, 6, 6, 6, 6]
    assert idx[9].tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 2, 3]
    assert idx.diagonal().eq(3).all()  # r_ii = k: "same position"


def test_relative_position_index_offset_matches_full_rows():
    full = relative_position_index(12, 12, clip=2)
    assert torch.equal(relative_position_index(3, 12, clip=2, offset=9), full[9:])
    assert relative_position_index(1, 5, clip=4, offset=4).tolist() == [[0, 1, 2, 3, 4]]  # keys 4..0 to the left


def test_relative_position_index_rectangular_and_clip_zero():
    assert relative_position_index(3, 7, clip=0).eq(0).all()  # a single vector: no order information
    idx = relative_position_index(2, 5, clip=10)
    assert idx.tolist() == [[10, 11, 12, 13, 14], [9, 10, 11, 12, 13]]  # unclipped: j - i + k


def test_relative_position_index_validates():
    with pytest.raises(ValueError):
        relative_position_index(3, 3, clip=-1)
    with pytest.raises(ValueError):
        relative_position_index(3, 3, clip=1, offset=-1)


def test_sinusoidal_positions_known_values():
    pe = sinusoidal_positions(6, 4)
    assert pe.shape == (6, 4) and pe.dtype == torch.float32
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]  # sin(0) on even dims, cos(0) on odd dims
    # dim 4: frequencies 1 and 1/10000^(2/4) = 1/100
    expected = torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)])
    torch.testing.assert_close(pe[1], expected)
    expected5 = torch.tensor([math.sin(5), math.cos(5), math.sin(0.05), math.cos(0.05)])
    torch.testing.assert_close(pe[5], expected5)


def test_sinusoidal_positions_offset_and_large_dim():
    pe = sinusoidal_positions(50, 512)
    torch.testing.assert_close(sinusoidal_positions(10, 512, offset=40), pe[40:])
    # position 3, dimension 2m = 100: sin(3 / 10000^(100/512))
    assert pe[3, 100].item() == pytest.approx(math.sin(3 / 10000 ** (100 / 512)), abs=1e-6)
    assert pe[3, 101].item() == pytest.approx(math.cos(3 / 10000 ** (100 / 512)), abs=1e-6)
    assert sinusoidal_positions(4, 5).shape == (4, 5)  # odd dims: last one is a sine


@pytest.mark.parametrize("settings, words", [
    (dict(positions="absolute"), "absolute"),
    (dict(positions="absolute", absolute_kind="learned"), "learned absolute"),
    (dict(positions="absolute+relative", absolute_kind="learned"), "learned absolute+relative"),
    (dict(positions="relative", absolute_kind="learned"), "relative"),  # no absolute vectors to be learned
    (dict(positions="t5"), "t5"),
])
def test_describe_positions_says_learned_absolute_vectors_are_learned(settings, words):
    """Reports said "absolute positions" for a learned table too, the sinusoids' name in Vaswani et al."""
    from rpr_mt.config import ModelConfig
    from rpr_mt.model.positions import describe_positions

    assert describe_positions(ModelConfig(**settings)) == words
