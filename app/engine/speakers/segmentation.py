"""Local speaker activity over sliding 10 s windows (pyannote segmentation-3.0, powerset decoded).

The model sees one 10 s window (160000 samples at 16 kHz) and scores 589 frames; each frame's 7
classes are the powerset of 3 local speakers with at most 2 at once: {}, {0}, {1}, {2}, {0, 1},
{0, 2}, {1, 2}. Decoding takes the most likely class per frame and marks its speakers active
(pyannote 3.x). Local speaker k of one window is unrelated to local speaker k of another:
linking them is the clustering's job.

Geometry (from the SincNet front end: kernels 251, 3, 5, 3, 5, 3 with strides 10, 3, 1, 3, 1, 3):
frame f of a window starting at t covers [t + f * FRAME_STEP_S, t + f * FRAME_STEP_S +
FRAME_DURATION_S), i.e. 991 samples every 270. Windows start every `step_s` seconds
(`window_starts`); the last one reaches past the end of the audio, which is padded with zeros.
"""

from __future__ import annotations

import math

import numpy as np

from app.runtime import speaker_contract as io
from app.runtime.contract import SAMPLE_RATE
from app.runtime.graphs import Graph

WINDOW_SAMPLES = 160_000  # 10 s
WINDOW_S = WINDOW_SAMPLES / SAMPLE_RATE
DEFAULT_STEP_S = 1.0  # pyannote's default: a tenth of the window
# windows per model call: the LSTM's 589 sequential steps are shared by the batch (CPU EP, 2
# cores: 4 windows per call take ~0.55x the time per window of 1; 8 gain nothing more)
DEFAULT_BATCH = 4
_KERNELS = ((251, 10), (3, 3), (5, 1), (3, 3), (5, 1), (3, 3))  # (size, stride), input first


def _receptive_field(frames: int) -> int:
    """Samples seen by `frames` consecutive output frames."""
    size = frames
    for kernel, stride in reversed(_KERNELS):
        size = kernel + (size - 1) * stride
    return size


def _frame_count(samples: int) -> int:
    for kernel, stride in _KERNELS:
        samples = 1 + (samples - kernel) // stride
    return samples


FRAME_SAMPLES = _receptive_field(1)  # 991
FRAME_STEP_SAMPLES = _receptive_field(2) - FRAME_SAMPLES  # 270
FRAME_DURATION_S = FRAME_SAMPLES / SAMPLE_RATE
FRAME_STEP_S = FRAME_STEP_SAMPLES / SAMPLE_RATE
FRAMES_PER_WINDOW = _frame_count(WINDOW_SAMPLES)  # 589
LOCAL_SPEAKERS = 3
# the powerset classes' speakers, in the model's class order
POWERSET = ((), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2))
POWERSET_MAPPING = np.array(
    [[k in speakers for k in range(LOCAL_SPEAKERS)] for speakers in POWERSET], np.float32
)  # [7, 3]


def window_starts(n_samples: int, step_s: float = DEFAULT_STEP_S) -> np.ndarray:
    """Start times (s) f64 [n_windows] of the windows covering `n_samples` samples: every
    `step_s` from 0 until one reaches the end (at least one window, also for empty audio)."""
    step = round(step_s * SAMPLE_RATE)
    if step <= 0:
        raise ValueError(f"step_s must be positive, got {step_s}")
    count = 1 + max(0, math.ceil((n_samples - WINDOW_SAMPLES) / step))
    return np.arange(count) * step / SAMPLE_RATE


def powerset_to_speakers(log_probs: np.ndarray) -> np.ndarray:
    """[..., 7] powerset scores -> [..., 3] f32 activity (1 = the speaker talks in the frame)."""
    return POWERSET_MAPPING[np.argmax(log_probs, axis=-1)]


class SpeakerSegmentation:
    """Per-frame local speaker activity of whole clips; thread-safe (the graph is)."""

    def __init__(
        self,
        session: Graph,
        step_s: float = DEFAULT_STEP_S,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        if not 0 < step_s <= WINDOW_S:
            raise ValueError(f"step_s must be in (0, {WINDOW_S}], got {step_s}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self._session = session
        self.step_s = step_s
        self.batch = batch

    def with_options(
        self, *, step_s: float | None = None, batch: int | None = None
    ) -> SpeakerSegmentation:
        """The same model with another window step and/or batch (the session is shared)."""
        return SpeakerSegmentation(
            self._session,
            self.step_s if step_s is None else step_s,
            self.batch if batch is None else batch,
        )

    def window_starts(self, n_samples: int) -> np.ndarray:
        """Start times (s) of the windows `__call__` returns for `n_samples` samples."""
        return window_starts(n_samples, self.step_s)

    def log_probs(self, windows: np.ndarray) -> np.ndarray:
        """The model on windows f32 [n, 160000] -> powerset log-probabilities [n, 589, 7]."""
        out = np.empty((len(windows), FRAMES_PER_WINDOW, io.POWERSET_CLASSES), np.float32)
        for start in range(0, len(windows), self.batch):
            chunk = windows[start : start + self.batch, None, :]
            (out[start : start + len(chunk)],) = self._session.run(
                [io.SEGMENTATION_OUTPUT],
                {io.SEGMENTATION_INPUT: np.ascontiguousarray(chunk, np.float32)},
            )
        return out

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """16 kHz mono f32 audio [N] (any length) -> activity f32 [n_windows, 589, 3] of 0/1.

        Window w starts at `window_starts(N)[w]`; frames as the module docstring says. Windows
        are made and scored `batch` at a time, so memory does not grow with N beyond the result.
        """
        audio = np.asarray(audio, np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D [N] samples, got shape {audio.shape}")
        starts = np.rint(self.window_starts(len(audio)) * SAMPLE_RATE).astype(np.int64)
        activity = np.empty((len(starts), FRAMES_PER_WINDOW, LOCAL_SPEAKERS), np.float32)
        for first in range(0, len(starts), self.batch):
            group = starts[first : first + self.batch]
            windows = np.zeros((len(group), WINDOW_SAMPLES), np.float32)
            for row, start in enumerate(group):
                piece = audio[start : start + WINDOW_SAMPLES]
                windows[row, : len(piece)] = piece
            activity[first : first + len(group)] = powerset_to_speakers(self.log_probs(windows))
        return activity
