"""The local-training tests run many tiny tensor operations; with intra-op threads, a
busy 2-core machine turns each of them into an OpenMP wait of milliseconds. One thread
keeps the suite fast and its results independent of the machine's load."""

import torch

torch.set_num_threads(1)
