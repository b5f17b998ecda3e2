"""Per-channel int8 weights of the model build (app.export.graph_builder.quantize_int8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from app.export import graph_builder
from app.export.graph_builder import GraphBuilder, WeightFormat, quantize_int8
from app.runtime.graphs import OPENVINO, ORT_CPU
from app.runtime.placement import open_graph


def test_round_trip_error_is_at_most_half_a_step_per_group() -> None:
    rng = np.random.default_rng(0)
    # rows (output channels) and column groups with very different ranges
    rows = rng.standard_normal((8, 256)).astype(np.float32)
    rows *= np.logspace(-3, 1, 8, dtype=np.float32)[:, None]
    rows[:, :64] *= 100  # one group of inputs far larger than the rest
    q, scale = quantize_int8(rows, group=64)
    assert q.dtype == np.int8 and q.shape == (8, 4, 64)
    assert scale.dtype == np.float16 and scale.shape == (8, 4, 1)
    assert np.all(np.abs(q).max(axis=2) >= 126)  # every group uses the full range
    restored = (q * scale.astype(np.float32)).reshape(8, 256)
    step = np.repeat(scale[:, :, 0].astype(np.float32), 64, axis=1)
    assert np.all(np.abs(restored - rows) <= step * 0.51)  # fp16 scales: a hair over half
    # one scale per row would have flattened the small groups of the smallest row to zero
    assert np.all(np.abs(q[0, 1:]).max(axis=1) >= 126)


def test_zero_groups_stay_zero_and_odd_widths_get_one_scale_per_row() -> None:
    rows = np.zeros((2, 128), np.float32)
    rows[1, 64:] = np.linspace(-1, 1, 64)
    q, scale = quantize_int8(rows, group=64)
    assert np.all(q[0] == 0) and np.all(q[1, 0] == 0) and np.all(np.isfinite(scale))
    q, scale = quantize_int8(np.ones((3, 80), np.float32), group=64)  # 64 does not divide 80
    assert q.shape == (3, 1, 80) and scale.shape == (3, 1, 1)


@pytest.mark.parametrize("ep", ["openvino", "cpu"])
def test_linear_with_int8_weights_runs_on_both_runtimes(
    ep: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((16, 32)).astype(np.float32)  # [out, in]
    bias = rng.standard_normal(16).astype(np.float32)
    g = GraphBuilder("linear", WeightFormat("float16", int8_matrices=True))
    monkeypatch.setattr(graph_builder, "INT8_GROUP", 16)
    x = g.input("x", np.float32, [2, 32])
    g.output(g.linear(x, weight, bias, "fc"), "y", np.float32, [2, 16])
    model = g.model()
    stored = {t.name: t.data_type for t in model.graph.initializer}
    assert stored["fc.weight_t"] == onnx.TensorProto.INT8
    assert stored["fc.bias"] == onnx.TensorProto.FLOAT16
    onnx.save(model, tmp_path / "linear.onnx")
    graph = open_graph(tmp_path / "linear.onnx", ep, "CPU", 1)
    assert graph.provider == {"openvino": OPENVINO, "cpu": ORT_CPU}[ep]
    inputs = rng.standard_normal((2, 32)).astype(np.float32)
    (got,) = graph.run(["y"], {"x": inputs})
    q, scale = quantize_int8(weight, group=16)  # [out, in] in groups of 16 inputs
    dequantized = inputs @ (q * scale.astype(np.float32)).reshape(16, 32).T
    dequantized += bias.astype(np.float16)
    # OpenVINO may also quantize the activations on the fly (int8 dot products): ~0.5 % off
    assert np.abs(got - dequantized).max() < 0.01 * np.abs(dequantized).max()
    exact = inputs @ weight.T + bias
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()
