"""Audio on its way into a live pass: the thread-safe inbox and the pass buffer.

`Inbox`: audio appended from any thread waits here until the session admits it (0.25 s at a
time, through the VAD); it also carries the client's marks — "finalize everything received up to
here" (flush) and "forget everything received up to here" (clear) — so that they apply in order
with the audio, whatever thread the client's messages arrive on.

`Hearing`: the session's VAD over the audio as it arrives, ahead of admission (while a pass
decodes): the speech events are known when the audio is heard, and admission applies each when it
reaches the sample where it was decided.

`AudioBuffer`: the contiguous audio a pass decodes (at most one 30 s window), addressed by
absolute sample numbers of the stream.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from app.engine.vad import CHUNK_SAMPLES, SileroVad, VadEvent, VadOptions, VadStream


class Inbox:
    """Audio appended (any thread) and not yet admitted; counts in samples, positions are
    absolute samples of the stream (cleared audio included).

    Flush marks queue up (each client commit is answered once); a piece taken never crosses
    the next one. A clear drops the audio after the last flush mark (committed audio is still
    transcribed); the next piece then starts later than the last one ended, which tells the
    session where the stream goes on.
    """

    def __init__(self) -> None:
        self._pieces: deque[tuple[int, np.ndarray]] = deque()  # (absolute start, f32 [n])
        self._lock = threading.Lock()
        self.samples = 0  # waiting
        self.received = 0  # appended in total
        self._flushes: deque[int] = deque()  # absolute samples, ascending
        self._clear_at: int | None = None  # the stream goes on here after a clear
        self._clears = 0  # clears asked for since the session last took them

    def append(self, audio: np.ndarray) -> None:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not audio.shape[0]:
            return
        with self._lock:
            self._pieces.append((self.received, audio))
            self.samples += audio.shape[0]
            self.received += audio.shape[0]

    def mark_flush(self) -> None:
        """Everything received so far is to be finalized once admitted."""
        with self._lock:
            if not self._flushes or self._flushes[-1] < self.received:
                self._flushes.append(self.received)

    def mark_clear(self) -> None:
        """Everything received after the last flush mark is to be dropped: the waiting audio
        at once; what the session admitted, once it took the flush marks (`take_clear`)."""
        with self._lock:
            keep_until = self._flushes[-1] if self._flushes else 0
            kept: deque[tuple[int, np.ndarray]] = deque()
            for start, piece in self._pieces:
                if start < keep_until:
                    kept.append((start, piece[: keep_until - start]))
            self._pieces = kept
            self.samples = sum(p.shape[0] for _, p in kept)
            self._clear_at = self.received
            self._clears += 1

    def _position(self) -> int:
        return self._pieces[0][0] if self._pieces else self.received

    def take(self, n: int) -> np.ndarray | None:
        """Up to `n` samples from the front (the oldest waiting audio); None when empty. A
        piece never crosses a flush mark: the audio after it waits until the flush is taken."""
        with self._lock:
            if not self._pieces:
                return None
            start, first = self._pieces[0]
            if self._flushes:
                n = min(n, self._flushes[0] - start)
            if n <= 0:
                return None
            if first.shape[0] <= n:
                self._pieces.popleft()
                piece = first
            else:
                piece = first[:n]
                self._pieces[0] = (start + n, first[n:])
            self.samples -= piece.shape[0]
            return piece

    def take_clear(self) -> tuple[int, int] | None:
        """(where the stream goes on, how many clears) once every flush mark before the clear
        was taken; None when no clear is due. Consumed."""
        with self._lock:
            if self._clear_at is None or self._flushes:
                return None
            due = (self._clear_at, self._clears)
            self._clear_at, self._clears = None, 0
            return due

    def flush_due(self) -> bool:
        """The next flush mark was reached: everything before it was admitted (consumed)."""
        with self._lock:
            due = bool(self._flushes) and self._position() >= self._flushes[0]
            if due:
                self._flushes.popleft()
            return due

    @property
    def pending_marks(self) -> bool:
        return bool(self._flushes) or self._clear_at is not None


class Hearing:
    """The session's VAD, run over the audio in the order it was received (`put`, `restart`
    by the one appender, before the inbox gets the audio; `listen` from any thread).

    `listen` hears what was put since it last ran (or up to a sample) and returns the new
    events; each is kept with the sample where it was decided (the end of the 32 ms chunk that
    decided it) until admission reaches that sample (`decided`). A clear restarts the VAD where
    the stream goes on (`restart` when asked, `forget` when the session drops the audio).

    `paused_since` is the pause as of the audio admission took (the events `decided` handed
    out), not as of all the VAD heard: it hears ahead, and speech it heard coming back after a
    pause must not make the session decode again a pause the last pass already covered."""

    def __init__(self, vad: SileroVad, options: VadOptions, pause_s: float | None) -> None:
        self._vad, self._options, self._pause_s = vad, options, pause_s
        self._stream = self._new(0)
        self._unheard: deque[np.ndarray | int] = deque()  # audio, or where a restart goes on
        self._decided: deque[tuple[int, VadEvent]] = deque()
        self._paused_at: int | None = None  # the taken events' pause: where its silence began
        self._put_heard = 0  # absolute sample: the audio put up to here went to the VAD
        self._queue_lock = threading.Lock()
        self._lock = threading.Lock()  # one listener at a time

    def _new(self, position: int) -> VadStream:
        stream = VadStream(self._vad, self._options, pause_s=self._pause_s)
        stream.position = position
        return stream

    def put(self, audio: np.ndarray) -> None:
        with self._queue_lock:
            self._unheard.append(audio)

    def restart(self, at: int) -> None:
        """A clear: the VAD starts afresh at absolute sample `at` (after what was put before)."""
        with self._queue_lock:
            self._unheard.append(at)

    def listen(self, hear: Callable[[VadEvent], None], until: int | None = None) -> None:
        """Run the VAD over the audio put since the last call, up to absolute sample `until`
        (all of it without), handing each new event to `hear` as it is decided. One listener
        at a time: a call returns once every event heard before it (by any thread) was handed
        on."""
        with self._lock:
            while True:
                with self._queue_lock:
                    if not self._unheard:
                        return
                    audio = self._unheard[0]
                    if isinstance(audio, int):
                        self._unheard.popleft()
                        self._stream, self._put_heard = self._new(audio), audio
                        continue
                    room = audio.shape[0] if until is None else until - self._put_heard
                    if room <= 0:
                        return
                    if room < audio.shape[0]:
                        audio, self._unheard[0] = audio[:room], audio[room:]
                    else:
                        self._unheard.popleft()
                self._put_heard += audio.shape[0]
                stream = self._stream
                for i in range(0, audio.shape[0], CHUNK_SAMPLES):  # one chunk decides at most
                    for event in stream.feed(audio[i : i + CHUNK_SAMPLES]):
                        self._decided.append((stream.position, event))
                        hear(event)

    def decided(self, until: int) -> list[VadEvent]:
        """The events decided by absolute sample `until` that admission has not taken yet
        (the caller listened after the inbox gave it that audio)."""
        with self._lock:
            taken: list[VadEvent] = []
            while self._decided and self._decided[0][0] <= until:
                event = self._decided.popleft()[1]
                self._paused_at = event.sample if event.kind == "pause" else None
                taken.append(event)
            return taken

    def forget(self, until: int) -> None:
        """A clear took effect at absolute sample `until`: the events of the audio it dropped
        go (the caller listened first)."""
        with self._lock:
            while self._decided and self._decided[0][0] <= until:
                self._decided.popleft()
            self._paused_at = None

    def silent_since(self) -> int | None:
        """Where the silence the VAD hears speech in began (None: speech, or no speech); it
        may have heard ahead of admission."""
        with self._lock:
            return self._stream.silence_start

    def paused_since(self) -> int | None:
        """Where the silence admission has reached began, if the VAD reported it as a pause
        (the events taken since hold no speech and no end)."""
        with self._lock:
            return self._paused_at


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

    def restart(self, sample: int) -> None:
        """Forget everything; the next audio starts at absolute `sample`."""
        self.start, self.length = sample, 0

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
