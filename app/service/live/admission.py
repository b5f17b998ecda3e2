"""Audio on its way into a live pass: the thread-safe inbox and the pass buffer.

`Inbox`: audio appended from any thread waits here until the session admits it (0.25 s at a
time, through the VAD); it also carries the client's marks — "finalize everything received up to
here" (flush) and "forget everything received up to here" (clear) — so that they apply in order
with the audio, whatever thread the client's messages arrive on.

`AudioBuffer`: the contiguous audio a pass decodes (at most one 30 s window), addressed by
absolute sample numbers of the stream.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class Inbox:
    """Audio appended (any thread) and not yet admitted; counts in samples."""

    def __init__(self) -> None:
        self._pieces: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self.samples = 0  # waiting
        self.received = 0  # appended in total
        self._flush_at: int | None = None
        self._clear_at: int | None = None

    def append(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not audio.shape[0]:
            return
        with self._lock:
            self._pieces.append(audio)
            self.samples += audio.shape[0]
            self.received += audio.shape[0]

    def mark_flush(self) -> None:
        """Everything received so far is to be finalized once admitted."""
        with self._lock:
            self._flush_at = self.received

    def mark_clear(self) -> None:
        """Everything received so far is to be dropped (the waiting audio at once)."""
        with self._lock:
            self._pieces.clear()
            self.samples = 0
            self._clear_at = self.received
            self._flush_at = None

    @property
    def admitted(self) -> int:
        return self.received - self.samples

    def take(self, n: int) -> np.ndarray | None:
        """Up to `n` samples from the front, None when empty."""
        with self._lock:
            if not self._pieces:
                return None
            first = self._pieces[0]
            if first.shape[0] <= n:
                self._pieces.popleft()
                piece = first
            else:
                piece = first[:n]
                self._pieces[0] = first[n:]
            self.samples -= piece.shape[0]
            return piece

    def take_clear(self) -> int | None:
        """The pending clear mark (absolute sample), consumed."""
        with self._lock:
            mark, self._clear_at = self._clear_at, None
            return mark

    def flush_due(self) -> bool:
        """A flush mark is pending and everything before it was admitted (consumes it)."""
        with self._lock:
            due = self._flush_at is not None and self.admitted >= self._flush_at
            if due:
                self._flush_at = None
            return due

    @property
    def pending_marks(self) -> bool:
        return self._flush_at is not None or self._clear_at is not None


class AudioBuffer:
    """Contiguous audio f32 [length] starting at absolute sample `start`, fixed capacity."""

    def __init__(self, capacity: int) -> None:
        self._data = np.zeros(capacity, np.float32)
        self.start = 0
        self.length = 0

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def capacity(self) -> int:
        return self._data.shape[0]

    def append(self, audio: np.ndarray) -> None:
        n = audio.shape[0]
        if self.length + n > self.capacity:
            raise OverflowError(f"audio buffer full ({self.length} + {n} > {self.capacity})")
        self._data[self.length : self.length + n] = audio
        self.length += n

    def drop_before(self, sample: int) -> None:
        """Forget the audio before absolute `sample`."""
        n = min(max(sample - self.start, 0), self.length)
        if n:
            self._data[: self.length - n] = self._data[n : self.length]
            self.length -= n
            self.start += n

    def view(self, until: int | None = None) -> np.ndarray:
        stop = self.length if until is None else min(max(until - self.start, 0), self.length)
        return self._data[:stop].copy()
