"""Keep the memory that tensors free inside the process, instead of glibc handing it back to the OS.

glibc's malloc serves a block larger than its mmap threshold (32 MiB at most) with a fresh mmap and
unmaps it when it is freed, and gives the top of its heap back past a trim threshold, so the next block
of that size is faulted in and zeroed page by page again. A training step of the mixture-search proxy
(16 x 128 positions, vocabulary 4,096) makes and frees several 32 MiB [positions, vocabulary] float32
tensors (logits, their log-softmax, their gradients): about 36,000 fresh pages (140 MiB) a step. With
mmap off and trimming off (one thread, 60 steps, another benchmark on the machine): 4.2 and 4.6 steps/s
became 7.1 and 7.2, page faults 2.2M became 68k, the loss curve and the checkpoint the same bits; the
peak resident memory 644 MiB became 698. Two proxies at once in the mixture search's two worker
processes (200 steps and scoring each, with evaluate.py's pieces, old and new in turn twice): 133.5 s and
76.7 s became 64.2 s and 58.0 s. The price: the process keeps its largest heap until it exits,
which a training process, one run long, can pay.
"""

from __future__ import annotations

import ctypes

# mallopt's parameter numbers, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# The largest trim threshold mallopt takes (an int): the heap is given back only past 2 GiB free at its top.
_NEVER_TRIM = 2**31 - 1


def keep_freed_memory() -> bool:
    """Serve every block from the heap and keep freed ones for reuse; False (nothing changed) where the C
    library is not glibc."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
