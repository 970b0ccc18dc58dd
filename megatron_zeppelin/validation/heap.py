"""Keep freed host memory in the process while calibrating and validating on a CPU, as CUDA's
caching allocator keeps device memory on a GPU.

glibc serves a block above its mmap threshold with fresh pages and returns them when it is freed;
the threshold moves with the process's history (it rises to the size of the last such block freed).
So whether a tensor of 1-3 MB (a merge of 768-3072 rows of this project's validation model) costs
its page faults at every allocation depends on what the process allocated before: the same
merge took 0.5 us a row in one process and 1.1-1.2 us in another, and the engine's passes moved
with it. Fixing both thresholds high (``mallopt``) makes a freed block's pages serve the next
allocation, in the calibration probes and in the timed passes alike.

>>> keep_heap() in (True, False)   # False where the C library is not glibc
True
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks below it come from the heap
TRIM_THRESHOLD = 1 << 30  # free heap kept before glibc gives it back


def keep_heap() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where that is not possible."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
