"""Weights read from external data files, dropped from memory once OpenVINO has packed them.

OpenVINO's CPU plugin keeps every weight twice: the graph's constant, and the copy it repacks
into its kernels' layout on the first run (measured with large-v3-turbo's int8 encoder, 647 MB:
RSS 0.96 GB after compile, 1.78 GB after the first window; benchmarks/results/memory_sizes.md).
When the weights sit in an external data file (`<graph>.onnx.data`), OpenVINO maps that file
read-only instead of copying it, and after the first run only the packed copy is read again. The
mapped pages are then clean file pages: `release` tells the kernel to drop them (madvise
MADV_DONTNEED), and should anything read them again they fault back in from the file, unchanged.
Only read-only mappings are touched, so no written page can be lost. Linux only; elsewhere (no
/proc/self/maps) nothing is released.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # from <sys/mman.h>
_MAPS = Path("/proc/self/maps")


@functools.cache
def _madvise():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def read_only_mappings(files: list[Path]) -> list[tuple[int, int]]:
    """[start, end) address ranges of this process's read-only mappings of `files`."""
    wanted = {str(Path(f).resolve()) for f in files}
    ranges = []
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] in wanted and "w" not in parts[1]:
            start, end = (int(x, 16) for x in parts[0].split("-"))
            ranges.append((start, end))
    return ranges


def release(files: list[Path]) -> int:
    """Drop the resident pages of the read-only mappings of `files`; the bytes of address space
    advised (0 when nothing maps them)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    advised = 0
    for start, end in read_only_mappings(files):
        if madvise(start, end - start, MADV_DONTNEED) != 0:
            size_mb = (end - start) >> 20
            log.warning("madvise over %d MB failed: errno %d", size_mb, ctypes.get_errno())
            continue
        advised += end - start
    return advised


def resident_bytes(files: list[Path]) -> int:
    """Resident bytes of this process's mappings of `files` (from /proc/self/smaps)."""
    wanted = {str(Path(f).resolve()) for f in files}
    total, inside = 0, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = len(head) == 6 and head[5] in wanted
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total
