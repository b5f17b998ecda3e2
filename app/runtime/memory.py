"""glibc malloc settings for a long-running inference process.

The decode loop allocates and frees arrays of every size from several threads: per decoder step
0.2-2 MB (logits of the rows, the logit filters' and the beam search's temporaries), per window
18-61 MB (cross K/V, encoder outputs). With glibc's defaults the mmap threshold rises to 32 MB
after the first large free, so the big arrays then come from per-thread arenas that fragment and
are rarely returned to the system. The settings here:

- mmap threshold 8 MiB: a window's arrays are mmapped and unmapped; a step's come from the heap
  and are reused step after step, up to the 25 rows of a window's fallback attempts decoded
  together (their logits: 5.2 MB a step). At 256 KiB (until 2026-11-30) every step's arrays were
  fresh mappings, page-faulted in on every step: ~1300 faults per beam-5 step, 170 000 (tiny.en)
  to 270 000 (base) per 60 s request, 16-19 % of its time; at 4 MiB the 25-row steps still were
  (the 10 min clip through the server, tiny.en: 15.2-15.3 -> 14.6-15.1 s greedy, 22.9-24.1 ->
  22.0-22.6 s beam 5; benchmarks/results/server_speed_epyc_bf16.md).
- trim threshold 32 MiB, and `release_free_memory` once the server has been idle a few seconds
  (`app.main.HEAP_IDLE_S`) and after a model's load: the heap keeps what requests reuse while
  they come and gives its free pages back when they stop, so RSS after a burst of requests goes
  back to where it was (the peak during a load is 20-40 MB higher). Trimmed after every request,
  the next one page-faulted its buffers back in (~3 % of a 60 s request's time).
- two arenas.

The same can be set with MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_ARENA_MAX before
the process starts; values already set that way are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

# mallopt parameters from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, 8 << 20),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, 32 << 20),
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, 2),
)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has mallopt and malloc_trim), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_malloc() -> bool:
    """Apply the settings above through mallopt(3); False when this is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    for env, parameter, value in SETTINGS:
        if env not in os.environ and mallopt(parameter, value) != 1:
            log.warning("mallopt(%d, %d) failed", parameter, value)
    return True


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (malloc_trim(3)); a no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def malloc_environment() -> dict[str, str]:
    """The same settings as environment variables, for launching a server process."""
    return {env: str(value) for env, _, value in SETTINGS}
