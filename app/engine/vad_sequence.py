"""A whole clip through Silero VAD in a few calls, exactly as chunk after chunk.

The sequence graphs (`app.export.vad_sequence`, built at `make models` beside `silero_vad.onnx`,
two per sample rate) run the VAD's spectrum and convolutions over all chunks at once (the
front) and its LSTM over the chunk sequence (the state carried from block to block), one call
each per `BLOCK_CHUNKS` chunks. The front sees each chunk alone, so the fronts of the next
blocks run on the side threads (`side_threads`) while the LSTM reads the block before them: the
probabilities are the sequential pass's, chunk for chunk (to float rounding, ~1e-6), and the
same bits as one graph of both parts.

Per 60 s of 16 kHz audio (AMD EPYC, 2 cores): the graphs ~18 ms (one graph of both parts on one
thread ~31 ms; a second ONNX Runtime thread inside it made it slower, ~36 ms: the LSTM's steps
are too small to share) and the whole pass (gains, the narrowband check) ~25 ms, against ~110 ms
for the same clip as parallel lanes of chunk-by-chunk calls and ~490 ms as one chunk per call.
Blocks of 256 chunks: as fast as 1024 (4096 was ~15 % slower on 10 min, its intermediates out of
the cache), and a server keeps ~8 MB after a 60 s pass instead of ~30 MB (the allocator keeps
what a block's intermediates took).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.engine.side_threads import SIDE_THREADS, beside
from app.runtime.graphs import Graph

BLOCK_CHUNKS = 256  # chunks per graph call (8 s at 16 kHz; ~2 MB of intermediates)
FRONTS_AHEAD = SIDE_THREADS  # blocks whose fronts run while the LSTM reads an earlier one
HIDDEN = 128  # Silero's LSTM state width
PARTS = ("front", "lstm")  # the graphs of one rate, in the order a block runs through them
FEATURES = "features"  # the front's output, the LSTM's input
OUTPUTS = ("probs", "h_out", "c_out")


def sequence_file(vad_path: Path, rate: int, part: str) -> Path:
    """Where the sequence graph `part` (of `PARTS`) of the Silero file `vad_path` for `rate` Hz
    lives."""
    return vad_path.with_name(f"{vad_path.stem}.sequence-{rate}.{part}.onnx")


class SequencePass:
    """The sequence graphs of a Silero file: per sample rate, its front and LSTM graphs (in
    `PARTS` order). Thread-safe; the fronts run on the side threads (`side_threads`)."""

    def __init__(self, sessions: dict[int, tuple[Graph, Graph]]) -> None:
        self.sessions = sessions

    def probs(self, chunks: np.ndarray, context: int, rate: int) -> np.ndarray:
        """Speech probability f32 [n] of chunks f32 [n, C] (already gained), in order from the
        zero state, as a chunk-by-chunk pass gives them."""
        front, lstm = self.sessions[rate]
        n = chunks.shape[0]
        out = np.empty(n, np.float32)
        h = np.zeros((1, 1, HIDDEN), np.float32)
        c = np.zeros((1, 1, HIDDEN), np.float32)
        starts = iter(range(0, n, BLOCK_CHUNKS))
        ahead: deque[tuple[int, Callable[[], list[np.ndarray]]]] = deque()

        def submit() -> None:
            start = next(starts, None)
            if start is not None:
                x = _framed(chunks, start, context)
                ahead.append((start, beside(front.run, (FEATURES,), {"x": x})))

        for _ in range(FRONTS_AHEAD):
            submit()
        while ahead:
            start, features = ahead.popleft()
            submit()
            feeds = {FEATURES: features()[0], "h_in": h, "c_in": c}
            probs, h, c = lstm.run(OUTPUTS, feeds)
            out[start : start + probs.shape[0]] = probs
        return out


def _framed(chunks: np.ndarray, start: int, context: int) -> np.ndarray:
    """The graph's input for the block of chunks from `start`: each chunk f32 [C] after the
    last `context` samples of the chunk before it (zeros before the first) -> [b, context + C]."""
    block = chunks[start : start + BLOCK_CHUNKS]
    size = chunks.shape[1]
    x = np.empty((block.shape[0], context + size), np.float32)
    x[:, context:] = block
    x[0, :context] = chunks[start - 1, size - context :] if start else 0.0
    x[1:, :context] = block[:-1, size - context :]
    return x
