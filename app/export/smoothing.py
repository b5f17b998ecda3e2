"""SmoothQuant (Xiao et al. 2023) for the graphs' int8 inputs: per-channel factors that move an
input's outlier channels into the weights that read it.

An int8 input has one scale per tensor (`GraphBuilder`), sized by its largest channel; where a
few channels reach far above the rest (after a LayerNorm: base's final one has a channel at 454
where the median reaches 24) the others are left a handful of int8 steps. With factors s per
input channel, x @ W^T is computed as (x / s) @ (W * s)^T: the same product, an input whose
channels are closer in range, and weights (int8 with a scale per output channel) that take the
outliers on. Where x is a LayerNorm's output the division folds into its scale and shift; where
it is the attention's output (softmax(q k^T) v, linear in v per channel) into the v projection:
the graph computes exactly what it did, with no extra operation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from app.export.weights import WhisperWeights


def smoothing_factors(
    reach: np.ndarray, readers: Sequence[np.ndarray], alpha: float = 0.5
) -> np.ndarray:
    """Factors s [in] (s = max |x| ^ alpha / max |W| ^ (1 - alpha) per input channel, scaled to
    a geometric mean of 1) for an input whose max |x| per channel is `reach` [in], read by the
    matrices `readers` ([out, in] each). alpha 0.5 splits the range evenly; nearer 1 moves more
    of it into the weights, whose int8 scale is per output channel."""
    w_reach = np.max([np.abs(w).max(axis=0) for w in readers], axis=0)
    s = np.maximum(reach, 1e-6) ** alpha / np.maximum(w_reach, 1e-6) ** (1 - alpha)
    return (s / np.exp(np.log(s).mean())).astype(np.float32)


def _attention_input(layer: str) -> str:
    return f"{layer}.self_attn.q_proj"  # the range of the first layer reading LN1's output


def _attention_output(layer: str) -> str:
    return f"{layer}.self_attn.out_proj"


def _feed_forward_input(layer: str) -> str:
    return f"{layer}.fc1"


CROSS_INPUT = "model.decoder.layers.0.encoder_attn.k_proj"  # the encoder output's range
# The encoder's alpha: the relative error of base's cross K/V (16 devcorpus windows, bf16, against
# the fp32 graph in f32) was 5.1 % with the cross projections' inputs alone in int8 unsmoothed,
# 7.9 % with every input but fc2's at alpha 0.5, 5.9 / 5.1 / 5.2 / 5.5 % at 0.7 / 0.8 / 0.85 / 0.9
# (tiny.en 3.6, 4.4, 3.3 / 3.1 / 3.1 / 3.2 %); of those, only 0.8 kept every word of the repo's
# English clips at both beams and both models: `benchmarks/results/encoder_int8.md`.
ENCODER_ALPHA = 0.8


def _readers(w: WhisperWeights, layer: str) -> dict[str, list[str]]:
    """The matrices reading each int8 input of one encoder layer, by the input's range name."""
    attn = f"{layer}.self_attn"
    return {
        _attention_input(layer): [f"{attn}.{p}_proj.weight" for p in "qkv"],
        _attention_output(layer): [f"{attn}.out_proj.weight"],
        _feed_forward_input(layer): [f"{layer}.fc1.weight"],
    }


def _cross_readers(w: WhisperWeights) -> list[str]:
    """The matrices reading the encoder's output: every text layer's cross K/V projection."""
    return [
        f"model.decoder.layers.{i}.encoder_attn.{p}_proj.weight"
        for i in range(w.dims().n_text_layer)
        for p in "kv"
    ]


def encoder_factors(w: WhisperWeights, ranges: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The factors of each int8 input of the encoder graph (its layers' and the cross K/V
    projections'), by range name, from the probed `ranges`."""
    readers = {CROSS_INPUT: _cross_readers(w)}
    for i in range(w.dims().n_audio_layer):
        readers.update(_readers(w, f"model.encoder.layers.{i}"))
    return {
        name: smoothing_factors(ranges[name], [w[r] for r in matrices], ENCODER_ALPHA)
        for name, matrices in readers.items()
    }


def smoothed_ranges(
    ranges: Mapping[str, np.ndarray], factors: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The ranges of the smoothed inputs (x / s per channel)."""
    return {name: r / factors[name] if name in factors else r for name, r in ranges.items()}


def _scale(
    folded: dict[str, np.ndarray],
    w: WhisperWeights,
    name: str,
    s: np.ndarray,
    divide: bool = False,
    axis: int = -1,
) -> None:
    """folded[name] = the tensor (as folded so far, else from `w`) multiplied or divided by s
    along `axis`."""
    value = folded.get(name, np.asarray(w[name], np.float32))
    shape = [1] * value.ndim
    shape[axis] = len(s)
    folded[name] = value / s.reshape(shape) if divide else value * s.reshape(shape)


def _fold_norm(
    folded: dict[str, np.ndarray], w: WhisperWeights, norm: str, readers: list[str], s: np.ndarray
) -> None:
    """The LayerNorm `norm` divided by s, the matrices `readers` of its output multiplied."""
    for p in ("weight", "bias"):
        _scale(folded, w, f"{norm}.{p}", s, divide=True)
    for name in readers:
        _scale(folded, w, name, s)


def smoothed_layer(
    w: WhisperWeights, layer: str, factors: Mapping[str, np.ndarray]
) -> WhisperWeights:
    """`w` with one encoder layer's tensors folded: LN1 and LN2 divided by their outputs'
    factors and q/k/v and fc1 multiplied by them; the v projection divided by the attention
    output's factors and the out projection multiplied by them. The other tensors are shared."""
    attn = f"{layer}.self_attn"
    readers = _readers(w, layer)
    folded: dict[str, np.ndarray] = {}
    for norm, name in (
        (f"{attn}_layer_norm", _attention_input(layer)),
        (f"{layer}.final_layer_norm", _feed_forward_input(layer)),
    ):
        _fold_norm(folded, w, norm, readers[name], factors[name])
    s_out = factors[_attention_output(layer)]
    _scale(folded, w, f"{attn}.v_proj.weight", s_out, divide=True, axis=0)
    _scale(folded, w, f"{attn}.v_proj.bias", s_out, divide=True)
    _scale(folded, w, f"{attn}.out_proj.weight", s_out)
    return dataclasses.replace(w, tensors={**w.tensors, **folded})


def smoothed_cross(w: WhisperWeights, factors: Mapping[str, np.ndarray]) -> WhisperWeights:
    """`w` with the encoder's final LayerNorm divided by its output's factors and every cross
    K/V projection multiplied by them."""
    folded: dict[str, np.ndarray] = {}
    _fold_norm(folded, w, "model.encoder.layer_norm", _cross_readers(w), factors[CROSS_INPUT])
    return dataclasses.replace(w, tensors={**w.tensors, **folded})
