"""Test-wide settings."""

import torch

# The tests run many small tensor ops. On a shared 2-core machine torch's intra-op threads wait on
# each other more than they help: the MoE balancing test took 34 s with 2 threads and 2 s with 1.
torch.set_num_threads(1)
