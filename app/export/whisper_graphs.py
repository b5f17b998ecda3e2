"""Whisper's encoder and decoder as ONNX graphs, written op by op from numpy weights.

I/O names and shapes follow `app.runtime.contract` (DESIGN.md, "Model folder").
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from app.export.graph_builder import GraphBuilder, Int8Table, WeightFormat
from app.export.smoothing import (
    encoder_factors,
    smoothed_cross,
    smoothed_layer,
    smoothed_ranges,
    smoothing_factors,
)
from app.export.weights import WhisperWeights
from app.runtime import contract

_MASKED = -1e9  # additive bias for a key that may not be attended


def _self_attention_qkv(
    g: GraphBuilder, x: str, w: WhisperWeights, prefix: str, int8_input: bool = False
) -> list[str]:
    """q, k, v [B, H, T, Dh] of one attention block's input x [B, T, D] (one int8 input for the
    three when `int8_input`: `GraphBuilder.linear`)."""
    dims = w.dims()
    projections = [
        g.linear(
            x,
            w[f"{prefix}.{p}_proj.weight"],
            None if p == "k" else w[f"{prefix}.{p}_proj.bias"],
            f"{prefix}.{p}_proj",
            int8_input,
        )
        for p in "qkv"
    ]
    return [g.split_heads(t, dims.n_heads, dims.head_dim) for t in projections]


def _attention_out(
    g: GraphBuilder, heads: str, w: WhisperWeights, prefix: str, int8_input: bool = False
) -> str:
    merged = g.merge_heads(heads, w.dims().d_model)
    return g.linear(
        merged,
        w[f"{prefix}.out_proj.weight"],
        w[f"{prefix}.out_proj.bias"],
        f"{prefix}.out_proj",
        int8_input,
    )


def _feed_forward(
    g: GraphBuilder, x: str, w: WhisperWeights, layer: str, int8_input: bool = False
) -> str:
    """x + fc2(gelu(fc1(LN(x)))) (fc1 with an int8 input when `int8_input`)."""
    h = g.layer_norm(
        x,
        w[f"{layer}.final_layer_norm.weight"],
        w[f"{layer}.final_layer_norm.bias"],
        f"{layer}.final_layer_norm",
    )
    fc1 = g.linear(h, w[f"{layer}.fc1.weight"], w[f"{layer}.fc1.bias"], f"{layer}.fc1", int8_input)
    h = g.linear(g.gelu(fc1), w[f"{layer}.fc2.weight"], w[f"{layer}.fc2.bias"], f"{layer}.fc2")
    return g.op("Add", [x, h])


def _pre_norm(g: GraphBuilder, x: str, w: WhisperWeights, name: str) -> str:
    return g.layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], name)


def build_encoder(
    w: WhisperWeights,
    weight_format: WeightFormat,
    input_ranges: Mapping[str, np.ndarray] | None = None,
    probe_ranges: bool = False,
) -> onnx.ModelProto:
    """input_features [B, n_mels, 3000] -> cross_k_i, cross_v_i [B, H, 1500, Dh] per text layer.

    With `input_ranges` (max |x| per channel, probed) the layers' q/k/v, out and fc1
    projections and the cross K/V projections (input: the encoder's final LayerNorm) take int8
    inputs, smoothed (`app.export.smoothing`; unsmoothed, the q/k/v and cross projections'
    int8 inputs changed a word of jfk on the live path, "so my" -> "so am I"); fc2's input
    (after the GELU) stays bf16/f32: its outliers lost words in int8 even smoothed
    (`benchmarks/results/encoder_int8.md`). `probe_ranges` adds the outputs a calibration
    reads the ranges from (`GraphBuilder`)."""
    dims = w.dims()
    factors: dict[str, np.ndarray] = {}
    if input_ranges is not None and weight_format.int8_inputs and not probe_ranges:
        factors = encoder_factors(w, input_ranges)
        input_ranges = smoothed_ranges(input_ranges, factors)
    g = GraphBuilder("whisper_encoder", weight_format, input_ranges, probe_ranges)
    features = g.input("input_features", np.float32, ["batch", dims.n_mels, contract.N_FRAMES])
    x = features
    for conv, stride in (("conv1", 1), ("conv2", 2)):
        prefix = f"model.encoder.{conv}"
        x = g.op(
            "Conv",
            [
                x,
                g.weight(f"{prefix}.weight", w[f"{prefix}.weight"]),
                g.weight(f"{prefix}.bias", w[f"{prefix}.bias"]),
            ],
            kernel_shape=[3],
            pads=[1, 1],
            strides=[stride],
        )
        x = g.gelu(x)  # [B, D, frames]
    x = g.op("Transpose", [x], perm=[0, 2, 1])  # [B, 1500, D]
    positions = w["model.encoder.embed_positions.weight"][: dims.n_audio_ctx]
    x = g.op("Add", [x, g.weight("model.encoder.embed_positions.weight", positions)])
    for i in range(dims.n_audio_layer):
        layer = f"model.encoder.layers.{i}"
        lw = smoothed_layer(w, layer, factors) if factors else w
        h = _pre_norm(g, x, lw, f"{layer}.self_attn_layer_norm")
        q, k, v = _self_attention_qkv(g, h, lw, f"{layer}.self_attn", int8_input=True)
        heads = g.attention(q, k, v, dims.head_dim)
        x = g.op("Add", [x, _attention_out(g, heads, lw, f"{layer}.self_attn", int8_input=True)])
        x = _feed_forward(g, x, lw, layer, int8_input=True)
        del lw
    w = smoothed_cross(w, factors) if factors else w
    x = _pre_norm(g, x, w, "model.encoder.layer_norm")  # encoder output [B, 1500, D]

    cross_shape = ["batch", dims.n_heads, dims.n_audio_ctx, dims.head_dim]
    for i in range(dims.n_text_layer):
        prefix = f"model.decoder.layers.{i}.encoder_attn"
        k = g.linear(x, w[f"{prefix}.k_proj.weight"], None, f"{prefix}.k_proj", int8_input=True)
        v = g.linear(
            x,
            w[f"{prefix}.v_proj.weight"],
            w[f"{prefix}.v_proj.bias"],
            f"{prefix}.v_proj",
            int8_input=True,
        )
        g.output(
            g.split_heads(k, dims.n_heads, dims.head_dim), f"cross_k_{i}", np.float32, cross_shape
        )
        g.output(
            g.split_heads(v, dims.n_heads, dims.head_dim), f"cross_v_{i}", np.float32, cross_shape
        )
    return g.model()


def _mask_bias(g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
    """Additive attention bias [B, 1, T, P+T]: the key mask and causality among the T new tokens.

    New token t (0-based) sits at key index P + t and may see keys j <= P + t that the mask allows.
    """
    zero, one = g.const(np.array(0, np.int64)), g.const(np.array(1, np.int64))
    n_new = g.op("Gather", [g.op("Shape", [input_ids]), one], axis=0)  # T (scalar)
    n_keys = g.op("Gather", [g.op("Shape", [attention_mask]), one], axis=0)  # P + T (scalar)
    n_past = g.op("Sub", [n_keys, n_new])
    key_index = g.op("Range", [zero, n_keys, one])  # [P+T]
    query_index = g.op("Add", [g.op("Range", [zero, n_new, one]), n_past])  # [T]
    causal = g.op(
        "LessOrEqual",
        [
            g.op("Unsqueeze", [key_index, g.const(np.array([0], np.int64))]),
            g.op("Unsqueeze", [query_index, g.const(np.array([1], np.int64))]),
        ],
    )  # [T, P+T]
    allowed_keys = g.op("Cast", [attention_mask], to=onnx.TensorProto.BOOL)
    allowed_keys = g.op("Unsqueeze", [allowed_keys, g.const(np.array([1, 2], np.int64))])
    allowed = g.op("And", [causal, allowed_keys])  # [B, 1, T, P+T]
    return g.op("Where", [allowed, g.const(np.float32(0.0)), g.const(np.float32(_MASKED))])


def _cross_attention(g: GraphBuilder, q: str, k: str, v: str, head_dim: int) -> str:
    """Attention of q [B, H, T, Dh] over the encoder's k/v [Bc, H, 1500, Dh], Bc dividing B.

    The B / Bc rows that share a window (beams over a batch-1 cross K/V) are folded into the
    query length, so each window's K/V is read once per call instead of once per row:
    q -> [Bc, H, (B / Bc) * T, Dh] -> attention -> back to [B, H, T, Dh].
    """
    q_shape = g.op("Shape", [q])  # [B, H, T, Dh]
    windows_and_heads = g.op("Slice", [g.op("Shape", [k]), g.const([0]), g.const([2])])
    rows_per_window = g.const(np.array([-1], np.int64))
    tokens_and_dim = g.op("Slice", [q_shape, g.const([2]), g.const([4])])
    # [B, H, T, Dh] -> [Bc, R, H, T, Dh] -> [Bc, H, R, T, Dh] -> [Bc, H, R*T, Dh]
    window_first = g.op(
        "Concat",
        [
            g.op("Slice", [windows_and_heads, g.const([0]), g.const([1])]),
            rows_per_window,
            g.op("Slice", [q_shape, g.const([1]), g.const([4])]),
        ],
        axis=0,
    )
    grouped = g.op("Transpose", [g.op("Reshape", [q, window_first])], perm=[0, 2, 1, 3, 4])
    folded = g.op("Reshape", [grouped, g.const(np.array([0, 0, -1, head_dim], np.int64))])
    heads = g.attention(folded, k, v, head_dim)  # [Bc, H, R*T, Dh]
    unfolded_shape = g.op("Concat", [windows_and_heads, rows_per_window, tokens_and_dim], axis=0)
    unfolded = g.op("Reshape", [heads, unfolded_shape])  # [Bc, H, R, T, Dh]
    rows_first = g.op("Transpose", [unfolded], perm=[0, 2, 1, 3, 4])  # [Bc, R, H, T, Dh]
    return g.op("Reshape", [rows_first, q_shape])


LOGITS_INPUT = "model.decoder.logits"  # the range name of the logits projection's input
EMBEDDING = "model.decoder.embed_tokens.weight"


def _embed(
    g: GraphBuilder,
    w: WhisperWeights,
    input_ids: str,
    position_ids: str,
    smoothing: np.ndarray | None,
) -> tuple[str, str | Int8Table]:
    """Token + position embeddings [B, T, D], and the token embedding [V, D] (a row per token,
    and per output channel of the tied logits projection): an `Int8Table` (with `smoothing`)
    when the logits projection takes int8 inputs, else a matrix value."""
    name = EMBEDDING
    if g.int8_inputs:
        embed: str | Int8Table = g.int8_table(name, w[name], smoothing)
        tokens = g.lookup(embed, input_ids)
    else:
        embed = g.matrix(name, w[name], channel_axis=0)
        tokens = g.op("Gather", [embed, input_ids])
    positions = g.weight(
        "model.decoder.embed_positions.weight", w["model.decoder.embed_positions.weight"]
    )
    return g.op("Add", [tokens, g.op("Gather", [positions, position_ids])]), embed


def _decoder_layers(
    g: GraphBuilder,
    w: WhisperWeights,
    x: str,
    bias: str,
    cross: dict[str, str],
    past: dict[str, str],
    alignment_heads: tuple[tuple[int, int], ...],
) -> tuple[str, str]:
    """The text layers over x [B, T, D] -> (final-normed x [B, T, D], alignment queries).

    Each layer's new self K/V [B, H, T, Dh] become the `new_k_i`/`new_v_i` outputs and the keys
    are past + new. The alignment queries [B, A, T, Dh] are the cross-attention queries (before
    the 1/sqrt(Dh) scale) of `alignment_heads`' (layer, head) pairs, in order: with the cross
    keys they give those heads' attention weights (word timing, `app.runtime.alignment`).
    """
    dims = w.dims()
    new_shape = ["batch", dims.n_heads, "new", dims.head_dim]
    queries: dict[tuple[int, int], str] = {}
    for i in range(dims.n_text_layer):
        layer = f"model.decoder.layers.{i}"
        h = _pre_norm(g, x, w, f"{layer}.self_attn_layer_norm")
        q, k, v = _self_attention_qkv(g, h, w, f"{layer}.self_attn")
        g.output(k, f"new_k_{i}", np.float32, new_shape)
        g.output(v, f"new_v_{i}", np.float32, new_shape)
        keys = g.op("Concat", [past[f"past_k_{i}"], k], axis=2)  # [B, H, P+T, Dh]
        values = g.op("Concat", [past[f"past_v_{i}"], v], axis=2)
        heads = g.attention(q, keys, values, dims.head_dim, bias)
        x = g.op("Add", [x, _attention_out(g, heads, w, f"{layer}.self_attn")])

        prefix = f"{layer}.encoder_attn"
        h = _pre_norm(g, x, w, f"{layer}.encoder_attn_layer_norm")
        q = g.linear(
            h, w[f"{prefix}.q_proj.weight"], w[f"{prefix}.q_proj.bias"], f"{prefix}.q_proj"
        )
        q = g.split_heads(q, dims.n_heads, dims.head_dim)
        for layer_index, head in alignment_heads:
            if layer_index == i:
                queries[(i, head)] = g.op("Gather", [q, g.const([head])], axis=1)
        cross_k, cross_v = cross[f"cross_k_{i}"], cross[f"cross_v_{i}"]
        heads = _cross_attention(g, q, cross_k, cross_v, dims.head_dim)
        x = g.op("Add", [x, _attention_out(g, heads, w, prefix)])
        x = _feed_forward(g, x, w, layer)
    x = _pre_norm(g, x, w, "model.decoder.layer_norm")  # [B, T, D]
    return x, g.op("Concat", [queries[head] for head in alignment_heads], axis=1)


def _logits(
    g: GraphBuilder,
    x: str,
    embed: str | Int8Table,
    input_ids: str,
    logits_at: str,
    dims: contract.Dims,
) -> str:
    """logits [B, K, V] = x[:, logits_at] @ embed^T at the K positions `logits_at` of the T new
    ones (a prompt's prefill needs one or two of its positions: the projection onto the
    vocabulary is most of a prefill's work), via Gemm(transB) on [B*K, D] so the embedding is
    stored once; with int8 inputs (`LOGITS_INPUT`'s range) over the int8 table."""
    picked = g.op("Gather", [x, logits_at], axis=1)  # [B, K, D]
    flat = g.op("Reshape", [picked, g.const(np.array([-1, dims.d_model], np.int64))])
    if isinstance(embed, Int8Table):
        logits = g.int8_projection(flat, embed, LOGITS_INPUT)  # [B*K, V]
    else:
        logits = g.op("Gemm", [flat, embed], transB=1)  # [B*K, V]
    batch = g.op("Slice", [g.op("Shape", [input_ids]), g.const(np.array([0], np.int64)),
                           g.const(np.array([1], np.int64))])  # fmt: skip
    out_shape = g.op(
        "Concat",
        [batch, g.op("Shape", [logits_at]), g.const(np.array([dims.n_vocab], np.int64))],
        axis=0,
    )
    return g.op("Reshape", [logits, out_shape])


def _cross_inputs(g: GraphBuilder, dims: contract.Dims, batch: str) -> dict[str, str]:
    shape = [batch, dims.n_heads, dims.n_audio_ctx, dims.head_dim]
    return {
        name: g.input(name, np.float32, shape)
        for name in contract.encoder_output_names(dims.n_text_layer)
    }


def build_decoder(
    w: WhisperWeights,
    weight_format: WeightFormat,
    alignment_heads: tuple[tuple[int, int], ...],
    input_ranges: Mapping[str, np.ndarray] | None = None,
    probe_ranges: bool = False,
) -> onnx.ModelProto:
    """One decoder graph for prefill, steps, beams, batches, the static buffer and word timing's
    alignment queries (contract.py).

    The logits projection takes int8 inputs when `input_ranges` gives `LOGITS_INPUT`'s ranges
    (`probe_ranges`: the probe that measures them, as for the encoder), smoothed
    (`app.export.smoothing`; over real decoder inputs the logits' KL divergence from exact
    was 9.6e-3 without and 1.35e-3 with it at base, 1.2e-3 -> 2.5e-4 at tiny.en); the token
    embedding is then one int8 table both read. The layers' own projections stay as they
    are."""
    dims = w.dims()
    if not alignment_heads:
        raise ValueError("the model has no alignment heads: word timing needs them")
    smoothing = None
    if input_ranges is not None and not probe_ranges:
        smoothing = smoothing_factors(input_ranges[LOGITS_INPUT], [w[EMBEDDING]])
        input_ranges = {**input_ranges, LOGITS_INPUT: input_ranges[LOGITS_INPUT] / smoothing}
    g = GraphBuilder("whisper_decoder", weight_format, input_ranges, probe_ranges)
    input_ids = g.input("input_ids", np.int64, ["batch", "new"])
    position_ids = g.input("position_ids", np.int64, ["batch", "new"])
    attention_mask = g.input("attention_mask", np.int64, ["batch", "total"])
    logits_at = g.input(contract.LOGITS_AT, np.int64, ["picked"])
    past_shape = ["batch", dims.n_heads, "past", dims.head_dim]
    past = {
        name: g.input(name, np.float32, past_shape)
        for name in contract.past_names(dims.n_text_layer)
    }
    cross = _cross_inputs(g, dims, "cross_batch")
    x, embed = _embed(g, w, input_ids, position_ids, smoothing)
    bias = _mask_bias(g, input_ids, attention_mask)
    x, queries = _decoder_layers(g, w, x, bias, cross, past, alignment_heads)
    logits = _logits(g, x, embed, input_ids, logits_at, dims)
    g.output(logits, "logits", np.float32, ["batch", "picked", dims.n_vocab])
    query_shape = ["batch", len(alignment_heads), "new", dims.head_dim]
    g.output(queries, "alignment_queries", np.float32, query_shape)
    return g.model()
