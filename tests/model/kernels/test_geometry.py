"""The index geometry of relative terms: ``toeplitz`` spreads per-distance values exactly like the O(L^2) index."""

import pytest
import torch

from rpr_mt.model.kernels.geometry import distance_range, relative_distance, toeplitz


@pytest.mark.parametrize("q_len,k_len,offset", [(1, 1, 0), (3, 5, 0), (5, 3, 0), (1, 7, 6), (4, 9, 2), (6, 6, 0)])
def test_toeplitz_of_the_distance_range_is_the_distance_matrix(q_len: int, k_len: int, offset: int) -> None:
    distances = distance_range(q_len, k_len, offset)
    assert distances.shape == (q_len + k_len - 1,)
    assert torch.equal(toeplitz(distances, q_len, k_len), relative_distance(q_len, k_len, offset))


def test_toeplitz_gradient_sums_each_diagonal() -> None:
    q_len, k_len = 4, 6
    values = torch.randn(3, q_len + k_len - 1, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, q_len, k_len, dtype=torch.float64)
    toeplitz(values, q_len, k_len).backward(grad)
    index = relative_distance(q_len, k_len) + q_len - 1  # [Lq, Lk] -> entry of values
    expected = torch.zeros_like(values).index_add_(1, index.flatten(), grad.flatten(1))
    assert torch.allclose(values.grad, expected)


def test_toeplitz_rejects_a_wrong_number_of_values() -> None:
    with pytest.raises(ValueError, match="q_len \\+ k_len - 1 = 8"):
        toeplitz(torch.zeros(7), 3, 6)
