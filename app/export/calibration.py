"""The ranges of the encoder's int8 inputs, measured on speech.

An int8 input is quantized with one scale per tensor, max |x| / 127, fixed in the graph: x's
largest magnitude on real speech. A probe encoder (`build_encoder(..., probe_ranges=True)`, the
same graph with each such input's max |x| as an extra output) runs on OpenVINO's CPU in f32 over
the calibration windows; a range is the largest value it gave. The windows are the clips in
`calibration/` (`calibration/README.md`: read and clean speech, a telephone-band earnings call),
turned into log-mel windows as the service does it (padded with 30 s of silence, cut every
3000 frames), so the short clips' windows are mostly the padding the encoder sees at every
file's end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from app.engine.audio import decode_audio
from app.engine.mel import log_mel_spectrogram
from app.export.graph_builder import RANGE_OUTPUT
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW
from app.runtime.graphs import OpenVINOGraph

CALIBRATION_AUDIO = Path(__file__).with_name("calibration")


def calibration_windows(n_mels: int) -> Iterator[np.ndarray]:
    """The calibration clips' encoder windows, f32 [1, n_mels, 3000] each."""
    for path in sorted(CALIBRATION_AUDIO.glob("*.flac")):
        audio = decode_audio(path)
        mel = log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES_PER_WINDOW)
        frames = len(audio) * N_FRAMES // N_SAMPLES_PER_WINDOW  # those holding audio
        for start in range(0, frames, N_FRAMES):
            yield np.ascontiguousarray(mel[None, :, start : start + N_FRAMES])


def measure_ranges(probe: Path, n_mels: int) -> dict[str, float]:
    """max |input| per int8 linear layer (by prefix) of the probe encoder at `probe`."""
    graph = OpenVINOGraph(probe, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    names = [n for n in graph.output_names if n.startswith(RANGE_OUTPUT)]
    reach = dict.fromkeys(names, 0.0)
    for window in calibration_windows(n_mels):
        for name, value in zip(names, graph.run(names, {"input_features": window}), strict=True):
            reach[name] = max(reach[name], float(value))
    return {name.removeprefix(RANGE_OUTPUT): value for name, value in reach.items()}
