"""Without CUDA, the Triton kernel tests run in Triton's interpreter. TRITON_INTERPRET must be set before Triton is
first imported (Triton's own library functions are compiled or interpreted at that import), so it is set here, before
any test module of this directory imports Triton; an explicit TRITON_INTERPRET in the environment wins."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
