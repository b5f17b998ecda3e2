"""Has the speaker finished their turn? Pipecat's Smart Turn v3.2 (BSD-2-Clause), a Whisper-tiny
sized encoder with a binary head, judges the last 8 s of a turn's 16 kHz audio (23 languages).

`python -m app.export vad` puts the model at `models/turn/smart-turn-v3.2.onnx` (from the
`pipecat-ai` wheel, with its licence; nothing of Pipecat is imported). Its input is what
transformers' `WhisperFeatureExtractor(chunk_length=8)` computes: the waveform scaled to zero
mean and unit variance, zero-padded at the front to 8 s (or its last 8 s), then Whisper's log-mel
(`app.engine.mel`, the same transform: within 6e-6 of Pipecat's vendored extractor on jfk);
its output the probability that the turn is complete.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from app.engine.mel import log_mel_spectrogram
from app.runtime.graphs import OrtGraph

log = logging.getLogger(__name__)

TURN_FILE = "turn/smart-turn-v3.2.onnx"
SAMPLE_RATE = 16_000
WINDOW_S = 8  # the model judges the last 8 s of the turn
_NORM_EPS = 1e-7


class TurnModelError(RuntimeError):
    """The turn model is missing or is not Smart Turn's."""


def turn_features(audio: np.ndarray) -> np.ndarray:
    """f32 [80, 800] log-mel of the last 8 s of f32 [N] 16 kHz audio (zeros in front of a
    shorter turn), after scaling the window to zero mean and unit variance."""
    n = WINDOW_S * SAMPLE_RATE
    audio = np.asarray(audio, np.float32).reshape(-1)[-n:]
    window = np.zeros(n, np.float32)
    window[n - audio.shape[0] :] = audio
    window = (window - window.mean()) / np.sqrt(window.var() + _NORM_EPS)
    return log_mel_spectrogram(window, 80)


class TurnModel:
    """The loaded Smart Turn graph on ONNX Runtime's CPU provider; one instance serves every
    session (its graph may be run from many threads at once)."""

    def __init__(self, graph: OrtGraph, path: Path) -> None:
        self.graph = graph
        self.path = path

    @classmethod
    def load(cls, path: Path | str, threads: int = 1) -> TurnModel:
        path = Path(path)
        if not path.is_file():
            raise TurnModelError(
                f"turn model {path} not found: fetch it with `make models` "
                f"(or `python -m app.export vad --models-dir {path.parent.parent}`)"
            )
        try:
            graph = OrtGraph(path, threads, spinning=False)
        except Exception as e:  # onnxruntime raises its own exception types
            raise TurnModelError(f"could not load the turn model {path}: {e}") from e
        if graph.input_names != ["input_features"] or graph.output_names != ["logits"]:
            raise TurnModelError(
                f"{path} is not Smart Turn v3: inputs {graph.input_names}, "
                f"outputs {graph.output_names}"
            )
        return cls(graph, path)

    def probability(self, audio: np.ndarray) -> float:
        """P(the turn is complete) for the turn's f32 [N] 16 kHz audio up to now (its last 8 s
        are judged; the silence after the speech included)."""
        features = turn_features(audio)[None]
        started = time.perf_counter()
        (out,) = self.graph.run(["logits"], {"input_features": features})
        log.debug("turn judged in %.0f ms", 1e3 * (time.perf_counter() - started))
        return float(out.reshape(-1)[0])
