"""Intra-op threads turn the check's tiny forward passes into OpenMP waits on a busy
machine (see tests/local/conftest.py); one thread keeps them fast."""

import torch

torch.set_num_threads(1)
