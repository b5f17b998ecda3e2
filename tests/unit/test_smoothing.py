"""SmoothQuant folded into the encoder's weights (`app.export.smoothing`): a layer and the cross
K/V projections compute what they did, and their int8 inputs arrive divided by their factors."""

from __future__ import annotations

import numpy as np

from app.export.smoothing import (
    CROSS_INPUT,
    encoder_factors,
    smoothed_cross,
    smoothed_layer,
    smoothed_ranges,
)
from app.export.weights import WhisperWeights

D, HEADS, T = 16, 2, 6
LAYER = "model.encoder.layers.0"
ATTN = f"{LAYER}.self_attn"
CROSS = "model.decoder.layers.0.encoder_attn"
FINAL = "model.encoder.layer_norm"


def _weights() -> WhisperWeights:
    rng = np.random.default_rng(3)
    t = {
        "model.decoder.embed_tokens.weight": rng.normal(size=(10, D)),
        "model.encoder.conv1.weight": rng.normal(size=(D, 4, 3)),
        "model.encoder.embed_positions.weight": rng.normal(size=(T, D)),
        "model.decoder.embed_positions.weight": rng.normal(size=(8, D)),
    }
    for norm in (f"{ATTN}_layer_norm", f"{LAYER}.final_layer_norm", FINAL):
        t[f"{norm}.weight"] = 1 + 0.1 * rng.normal(size=D)
        t[f"{norm}.bias"] = 0.1 * rng.normal(size=D)
        t[f"{norm}.weight"][5] = 30.0  # an outlier channel, as Whisper's LayerNorms give
    for p in ("q", "k", "v", "out"):
        t[f"{ATTN}.{p}_proj.weight"] = rng.normal(size=(D, D)) / 4
        if p != "k":
            t[f"{ATTN}.{p}_proj.bias"] = rng.normal(size=D) / 4
    t[f"{ATTN}.v_proj.weight"][3] *= 20  # an outlier channel of the attention's output
    t[f"{LAYER}.fc1.weight"] = rng.normal(size=(4 * D, D)) / 4
    t[f"{LAYER}.fc1.bias"] = rng.normal(size=4 * D) / 4
    t[f"{CROSS}.k_proj.weight"] = rng.normal(size=(D, D)) / 4  # one text layer
    t[f"{CROSS}.v_proj.weight"] = rng.normal(size=(D, D)) / 4
    t[f"{CROSS}.v_proj.bias"] = rng.normal(size=D) / 4
    return WhisperWeights({k: v.astype(np.float32) for k, v in t.items()}, n_heads=HEADS)


def _norm(x: np.ndarray, w: WhisperWeights, name: str) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
    return normed * w[f"{name}.weight"] + w[f"{name}.bias"]


def _layer(x: np.ndarray, w: WhisperWeights) -> dict[str, np.ndarray]:
    """The layer up to fc1, and the cross K/V projections over a LayerNorm standing in for the
    encoder's final one, in numpy: each int8 input (by range name) and the outputs."""
    h = _norm(x, w, f"{ATTN}_layer_norm")
    q, k, v = (
        h @ w[f"{ATTN}.{p}_proj.weight"].T + (0 if p == "k" else w[f"{ATTN}.{p}_proj.bias"])
        for p in "qkv"
    )
    heads = [slice(i * D // HEADS, (i + 1) * D // HEADS) for i in range(HEADS)]
    attended = np.zeros_like(v)
    for part in heads:
        scores = q[:, part] @ k[:, part].T / np.sqrt(D // HEADS)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        attended[:, part] = weights / weights.sum(-1, keepdims=True) @ v[:, part]
    x = x + attended @ w[f"{ATTN}.out_proj.weight"].T + w[f"{ATTN}.out_proj.bias"]
    h2 = _norm(x, w, f"{LAYER}.final_layer_norm")
    out = _norm(x, w, FINAL)  # standing in for the encoder's output
    return {
        f"{ATTN}.q_proj": h,
        f"{ATTN}.out_proj": attended,
        f"{LAYER}.fc1": h2,
        CROSS_INPUT: out,
        "outputs": np.concatenate(
            [
                h2 @ w[f"{LAYER}.fc1.weight"].T + w[f"{LAYER}.fc1.bias"],
                out @ w[f"{CROSS}.k_proj.weight"].T,
                out @ w[f"{CROSS}.v_proj.weight"].T + w[f"{CROSS}.v_proj.bias"],
            ],
            axis=-1,
        ),
    }


def test_folded_smoothing_keeps_the_encoder_and_divides_its_int8_inputs_by_the_factors() -> None:
    w = _weights()
    x = np.random.default_rng(4).normal(size=(T, D)).astype(np.float32)
    before = _layer(x, w)
    ranges = {name: np.abs(v).max(0) for name, v in before.items() if name != "outputs"}
    factors = encoder_factors(w, ranges)
    assert set(factors) == set(ranges)
    after = _layer(x, smoothed_cross(smoothed_layer(w, LAYER, factors), factors))

    np.testing.assert_allclose(after["outputs"], before["outputs"], rtol=1e-4, atol=1e-4)
    for name, s in factors.items():
        assert np.ptp(np.log(s)) > 1.0, name  # the outlier channels are moved
        np.testing.assert_allclose(after[name], before[name] / s, rtol=1e-4, atol=1e-4)
        # the smoothed input's range is what the graph quantizes with, and it is narrower
        reach = smoothed_ranges(ranges, factors)[name]
        np.testing.assert_allclose(np.abs(after[name]).max(0), reach, rtol=1e-4)
        assert reach.max() / np.median(reach) < ranges[name].max() / np.median(ranges[name])
