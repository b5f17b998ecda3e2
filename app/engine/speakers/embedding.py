"""Speaker embeddings (CAM++, 192-d) of a stretch of audio, optionally of the frames a mask keeps.

The Kaldi fbank of the whole stretch is computed once (`fbank`; `of_fbank` takes it computed
already, to embed several speakers of one window from one fbank); a mask keeps the frames where
one speaker talks (pyannote's way: the mask, at any rate spread evenly over the audio, is read
at each fbank frame's centre), the kept frames are mean-normalised and go through the model
together. The result is L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import numpy as np

from app.engine.speakers.fbank import FRAME_LENGTH, FRAME_SHIFT, fbank, frame_count, mean_normalised
from app.runtime import speaker_contract as io
from app.runtime.graphs import Graph

MIN_FRAMES = 20  # kept fbank frames (10 ms each) below which no embedding is made


class TooLittleSpeech(ValueError):
    """The audio (or what its mask keeps) is too short for an embedding."""


def frames_kept(n_samples: int, mask: np.ndarray | None) -> np.ndarray:
    """Boolean [frames] of the fbank frames `mask` (weights > 0.5, spread over `n_samples`
    samples) keeps; all frames without a mask."""
    n_frames = frame_count(n_samples)
    if mask is None:
        return np.ones(n_frames, bool)
    mask = np.asarray(mask)
    if mask.ndim != 1 or len(mask) == 0:
        raise ValueError(f"mask must be 1-D and not empty, got shape {mask.shape}")
    centres = np.arange(n_frames) * FRAME_SHIFT + FRAME_LENGTH // 2
    index = np.minimum(centres * len(mask) // max(n_samples, 1), len(mask) - 1)
    return mask[index].astype(np.float32) > 0.5


def kept_features(rows: np.ndarray, n_samples: int, mask: np.ndarray | None) -> np.ndarray:
    """The model's input f32 [kept frames, 80] from the fbank `rows` of `n_samples` samples:
    the rows `mask` keeps, mean-normalised. Raises `TooLittleSpeech` below `MIN_FRAMES`."""
    keep = frames_kept(n_samples, mask)
    if len(rows) != len(keep):
        raise ValueError(f"{len(rows)} fbank rows for {n_samples} samples ({len(keep)} frames)")
    if keep.sum() < MIN_FRAMES:
        raise TooLittleSpeech(
            f"{int(keep.sum())} frames of speech kept, an embedding needs {MIN_FRAMES} "
            f"({MIN_FRAMES * FRAME_SHIFT / 16:.0f} ms)"
        )
    return mean_normalised(rows[keep])


class SpeakerEmbedding:
    """CAM++ on the graph `session`; thread-safe (the graph is)."""

    def __init__(self, session: Graph) -> None:
        self._session = session

    def features(self, audio: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """The model's input f32 [kept frames, 80]: mean-normalised fbank of the kept frames."""
        audio = np.asarray(audio, np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D [N] samples, got shape {audio.shape}")
        return kept_features(fbank(audio), len(audio), mask)

    def __call__(self, audio: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """16 kHz mono f32 audio [N] (and a mask [M], see the module docstring) -> f32 [192],
        L2-normalised. Raises `TooLittleSpeech` below `MIN_FRAMES` kept frames."""
        return self._embed(self.features(audio, mask))

    def of_fbank(self, rows: np.ndarray, n_samples: int, mask: np.ndarray) -> np.ndarray:
        """`self(audio, mask)` from `rows = fbank(audio)` (`n_samples` long), computed once for
        all the speakers of a stretch of audio: the same vector."""
        return self._embed(kept_features(rows, n_samples, mask))

    def _embed(self, features: np.ndarray) -> np.ndarray:
        (embedding,) = self._session.run(
            [io.EMBEDDING_OUTPUT], {io.EMBEDDING_INPUT: features[None]}
        )
        vector = embedding[0]
        return vector / max(float(np.linalg.norm(vector)), 1e-12)
