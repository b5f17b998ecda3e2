"""Cross-attention K/V of the windows the batching scheduler encoded, kept in one slab.

A decoder row reads its window's cross K/V ([H, 1500, Dh] per layer, 18 MB for tiny, 37 MB for
base in f32) as much as the weights, so they are never copied per step: windows are written
once into a slab of slots ([slots, H, 1500, Dh] per layer) and callers get views of their slot
(`CrossKV`), released when the caller drops them. Used by `app.service.batching.scheduler`.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections.abc import Callable

import numpy as np


class CrossKV(list):
    """One window's cross K/V, `[cross_k_0, cross_v_0, ...]` each f32 [1, H, 1500, Dh], as views
    of slot `slot` of a `CrossSlab`; the slot is freed when this list is garbage-collected. The
    slab may move the window to a lower slot: it then re-points the list's items in place."""

    __slots__ = ("__weakref__", "_cell", "slab")

    @property
    def slot(self) -> int:
        return self._cell[0]


class CrossSlab:
    """Fixed slots for windows' cross K/V: per layer one f32 [slots, H, 1500, Dh] array in private
    anonymous memory, committed as slots are used and handed back to the system when a slot
    frees (so the slab holds about what the live windows need). Lowest free slot first, and
    `compact()` moves windows down into freed slots, so live windows stay packed and a group
    needs no dummy rows."""

    def __init__(self, like: list[np.ndarray], slots: int) -> None:
        self._maps = [
            mmap.mmap(-1, slots * a[0].nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            for a in like
        ]
        self.arrays = [
            np.frombuffer(m, a.dtype).reshape(slots, *a.shape[1:])
            for m, a in zip(self._maps, like, strict=True)
        ]
        self.slot_nbytes = like[0][0].nbytes
        self.slots = slots
        self._free = list(range(slots))
        self._holders: dict[int, weakref.ref[CrossKV]] = {}
        self._lock = threading.Lock()

    def store(self, cross: list[np.ndarray], row: int) -> CrossKV | None:
        """Copy row `row` of encoder outputs into a free slot; None when every slot is taken."""
        slots = self._take(1)
        if not slots:
            return None
        for dst, src in zip(self.arrays, cross, strict=True):
            dst[slots[0]] = src[row]
        return self._hold(slots[0])

    def write(
        self,
        windows: list[np.ndarray],
        encode_into: Callable[[np.ndarray, list[np.ndarray]], None],
    ) -> list[CrossKV] | None:
        """Encode single windows (features f32 [1, n_mels, 3000] each) straight into free slots:
        `encode_into(features [k, ...], outputs)` writes each run of k adjacent slots (no output
        arrays made and copied per window). None when fewer slots are free than windows."""
        slots = self._take(len(windows))
        if not slots:
            return None
        try:
            first = 0  # windows[first:k] go to the adjacent slots slots[first:k]
            for k in range(1, len(slots) + 1):
                if k == len(slots) or slots[k] != slots[k - 1] + 1:
                    features = np.concatenate(windows[first:k])
                    encode_into(features, self.view(slots[first], slots[k - 1] + 1))
                    first = k
        except BaseException:
            with self._lock:
                for slot in slots:
                    self._free_slot_locked(slot)
            raise
        return [self._hold(slot) for slot in slots]

    def _take(self, n: int) -> list[int]:
        """Reserve the `n` lowest free slots (all `n` or none: [])."""
        with self._lock:
            if len(self._free) < n:
                return []
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def _hold(self, slot: int) -> CrossKV:
        """The window written into reserved `slot`, held until the returned list is dropped."""
        held = CrossKV(a[slot : slot + 1] for a in self.arrays)
        held.slab, held._cell = self, [slot]
        with self._lock:
            self._holders[slot] = weakref.ref(held)
        weakref.finalize(held, self._release, held._cell)
        return held

    def compact(self) -> int:
        """Move the windows of the highest used slots into lower free ones; returns the moves.
        Only the thread that reads the slab (the decoder lane) may call this."""
        moves = 0
        while True:
            with self._lock:
                lowest_free = self._free[0] if self._free else self.slots
                above = [slot for slot in self._holders if slot > lowest_free]
                holder = self._holders[max(above)]() if above else None
                if holder is None:
                    return moves
                source, target = holder.slot, self._free.pop(0)
            for layer, array in enumerate(self.arrays):
                array[target] = array[source]
                holder[layer] = array[target : target + 1]
            with self._lock:
                holder._cell[0] = target
                del self._holders[source]
                self._holders[target] = weakref.ref(holder)
                self._free_slot_locked(source)
            del holder
            moves += 1

    def view(self, lo: int, hi: int) -> list[np.ndarray]:
        """Slots lo..hi-1 of every layer, [hi - lo, H, 1500, Dh] each (contiguous, no copy)."""
        return [a[lo:hi] for a in self.arrays]

    @property
    def used(self) -> int:
        with self._lock:
            return self.slots - len(self._free)

    def _release(self, cell: list[int]) -> None:
        with self._lock:
            self._holders.pop(cell[0], None)
            self._free_slot_locked(cell[0])

    def _free_slot_locked(self, slot: int) -> None:
        """Mark `slot` free and return its whole memory pages to the system."""
        self._free.append(slot)
        self._free.sort()
        page = mmap.PAGESIZE
        start = -(-slot * self.slot_nbytes // page) * page  # first page boundary in the slot
        end = (slot + 1) * self.slot_nbytes // page * page
        if end > start:
            for m in self._maps:
                m.madvise(mmap.MADV_DONTNEED, start, end - start)
