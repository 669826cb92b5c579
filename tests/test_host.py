import sys

import pytest
import torch

from rpr_mt.host import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_keep_freed_memory_takes_effect_and_is_idempotent():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
    # Large tensors still allocate, free and reallocate normally.
    for _ in range(3):
        x = torch.ones(64, 2**20)
        assert x.sum().item() == 64 * 2**20
        del x
