"""A whole clip through Silero VAD in a few calls, exactly as chunk after chunk.

The sequence graphs (`app.export.vad_sequence`, built at `make models` beside `silero_vad.onnx`,
one per sample rate) run the VAD's spectrum and convolutions over all chunks at once and its LSTM
over the chunk sequence, in one graph call per `BLOCK_CHUNKS` chunks (the state is carried from
block to block). The probabilities are the sequential pass's, chunk for chunk (to float rounding,
~1e-6).

Per 60 s of 16 kHz audio (AMD EPYC, 2 cores): the graph ~22-32 ms on one thread (a second
thread makes it slower: ~36 ms, the same probabilities) and the whole pass (gains, the
narrowband check) ~32-45 ms, against ~110 ms for the same clip as parallel lanes of
chunk-by-chunk calls and ~490 ms as one chunk per call; 10 min: ~310 ms (lanes: ~1.08 s). Blocks
of 256 chunks: as fast as 1024 (4096 was ~15 % slower on 10 min, its intermediates out of the
cache), and a server keeps ~8 MB after a 60 s pass instead of ~30 MB (the allocator keeps what a
block's intermediates took).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.runtime.graphs import Graph

BLOCK_CHUNKS = 256  # chunks per graph call (8 s at 16 kHz; ~2 MB of intermediates)
HIDDEN = 128  # Silero's LSTM state width
OUTPUTS = ("probs", "h_out", "c_out")


def sequence_file(vad_path: Path, rate: int) -> Path:
    """Where the sequence graph of the Silero file `vad_path` for `rate` Hz lives."""
    return vad_path.with_name(f"{vad_path.stem}.sequence-{rate}.onnx")


class SequencePass:
    """The sequence graphs of a Silero file, one per sample rate (thread-safe)."""

    def __init__(self, sessions: dict[int, Graph]) -> None:
        self.sessions = sessions

    def probs(self, chunks: np.ndarray, context: int, rate: int) -> np.ndarray:
        """Speech probability f32 [n] of chunks f32 [n, C] (already gained), in order from the
        zero state, as a chunk-by-chunk pass gives them."""
        session = self.sessions[rate]
        n, size = chunks.shape
        out = np.empty(n, np.float32)
        h = np.zeros((1, 1, HIDDEN), np.float32)
        c = np.zeros((1, 1, HIDDEN), np.float32)
        tail = np.zeros(context, np.float32)
        for start in range(0, n, BLOCK_CHUNKS):
            block = chunks[start : start + BLOCK_CHUNKS]
            x = np.empty((block.shape[0], context + size), np.float32)
            x[:, context:] = block
            x[0, :context] = tail
            x[1:, :context] = block[:-1, size - context :]
            feeds = {"x": x, "h_in": h, "c_in": c}
            out[start : start + block.shape[0]], h, c = session.run(OUTPUTS, feeds)
            tail = block[-1, size - context :]
        return out
