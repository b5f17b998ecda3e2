"""The ranges of the graphs' int8 inputs, measured on speech.

An int8 input is quantized with one scale per tensor, max |x| / 127, fixed in the graph: x's
largest magnitude on real speech. A probe graph (`build_encoder` / `build_decoder` with
`probe_ranges=True`: the same graph with each such input's max |x| as an extra output) runs on
OpenVINO's CPU in f32 over the calibration windows; a range is the largest value it gave. The
windows are the clips in `calibration/` (`calibration/README.md`: read and clean speech, a
telephone-band earnings call), turned into log-mel windows as the service does it (padded with
30 s of silence, cut every 3000 frames), so the short clips' windows are mostly the padding the
encoder sees at every file's end. The probe decoder reads what it would be asked to: each
window's text, decoded greedily (timestamps on) from the window's cross K/V by the built
encoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from app.engine.audio import decode_audio
from app.engine.mel import log_mel_spectrogram
from app.export.graph_builder import RANGE_OUTPUT
from app.runtime import contract
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, Manifest
from app.runtime.graphs import OpenVINOGraph
from app.runtime.placement import int8_input_properties

CALIBRATION_AUDIO = Path(__file__).with_name("calibration")
# f32, the int8-input layers exact on this CPU (in float where it has no int8 dot products)
F32 = {"INFERENCE_PRECISION_HINT": "f32", **int8_input_properties()}
DECODED_TOKENS = 64  # tokens decoded per window for the probe decoder


def calibration_windows(n_mels: int) -> Iterator[np.ndarray]:
    """The calibration clips' encoder windows, f32 [1, n_mels, 3000] each."""
    for path in sorted(CALIBRATION_AUDIO.glob("*.flac")):
        audio = decode_audio(path)
        mel = log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES_PER_WINDOW)
        frames = len(audio) * N_FRAMES // N_SAMPLES_PER_WINDOW  # those holding audio
        for start in range(0, frames, N_FRAMES):
            yield np.ascontiguousarray(mel[None, :, start : start + N_FRAMES])


class _Reach:
    """The largest value per channel each of a probe graph's range outputs gave."""

    def __init__(self, graph: OpenVINOGraph) -> None:
        self.names = [n for n in graph.output_names if n.startswith(RANGE_OUTPUT)]
        self._reach: dict[str, np.ndarray] = {}

    def add(self, values: list[np.ndarray]) -> None:
        for name, value in zip(self.names, values, strict=True):
            self._reach[name] = np.maximum(self._reach.get(name, value), value)

    def ranges(self) -> dict[str, np.ndarray]:
        return {name.removeprefix(RANGE_OUTPUT): v for name, v in self._reach.items()}


def measure_ranges(probe: Path, n_mels: int) -> dict[str, np.ndarray]:
    """max |input| per channel of each int8 input (by prefix) of the probe encoder at `probe`."""
    graph = OpenVINOGraph(probe, "CPU", F32)
    reach = _Reach(graph)
    for window in calibration_windows(n_mels):
        reach.add(graph.run(reach.names, {"input_features": window}))
    return reach.ranges()


def measure_decoder_ranges(probe: Path, encoder: Path, manifest: Manifest) -> dict[str, np.ndarray]:
    """max |input| per channel of each int8 input (by prefix) of the probe decoder at `probe`,
    over the first `DECODED_TOKENS` tokens of each calibration window, decoded greedily from the
    cross K/V of the encoder at `encoder`."""
    dims, special = manifest.dims, manifest.special
    encoder_graph = OpenVINOGraph(encoder, "CPU", F32)
    decoder = OpenVINOGraph(probe, "CPU", F32)
    reach = _Reach(decoder)
    cross_names = contract.encoder_output_names(dims.n_text_layer)
    past_names = contract.past_names(dims.n_text_layer)
    step_outputs = contract.decoder_step_output_names(dims.n_text_layer)
    prompt = [special.sot]
    if manifest.multilingual:
        prompt += [manifest.language_ids["en"], special.transcribe]
    for window in calibration_windows(dims.n_mels):
        cross = encoder_graph.run(cross_names, {"input_features": window})
        empty = np.zeros((1, dims.n_heads, 0, dims.head_dim), np.float32)
        past = [empty] * len(past_names)
        new_ids, tokens = prompt, list(prompt)
        while len(tokens) < len(prompt) + DECODED_TOKENS:
            feed = {
                "input_ids": np.array([new_ids], np.int64),
                "position_ids": np.arange(len(tokens) - len(new_ids), len(tokens))[None],
                "attention_mask": np.ones((1, len(tokens)), np.int64),
                contract.LOGITS_AT: np.arange(len(new_ids), dtype=np.int64),
                **dict(zip(past_names, past, strict=True)),
                **dict(zip(cross_names, cross, strict=True)),
            }
            logits, *rest = decoder.run([*step_outputs, *reach.names], feed)
            new, ranges = rest[: len(past)], rest[len(past) :]
            reach.add(ranges)
            past = [np.concatenate(pair, axis=2) for pair in zip(past, new, strict=True)]
            token = int(logits[0, -1].argmax())
            if token == special.eot:
                break
            new_ids = [token]
            tokens.append(token)
    return reach.ranges()
