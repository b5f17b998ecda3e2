"""Per-channel int8 weights of the model build (app.export.graph_builder.quantize_int8)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.export.graph_builder import GraphBuilder, WeightFormat, quantize_int8


def test_round_trip_error_is_at_most_half_a_step_per_channel() -> None:
    rng = np.random.default_rng(0)
    # output channels along axis 1 with very different ranges, as in real linear layers
    weight = rng.standard_normal((64, 8)).astype(np.float32) * np.logspace(
        -3, 1, 8, dtype=np.float32
    )
    q, scale = quantize_int8(weight, axis=1)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (8,)
    assert np.abs(q).max() == 127  # each channel uses the full range
    error = np.abs(q * scale - weight)
    assert np.all(error <= scale / 2 + 1e-7)
    # a per-tensor scale would have flattened the smallest channel to zero
    assert np.abs(q[:, 0]).max() == 127


def test_an_all_zero_channel_stays_zero() -> None:
    weight = np.zeros((3, 4), np.float32)
    weight[:, 1] = [0.5, -1.0, 0.25]
    q, scale = quantize_int8(weight, axis=1)
    assert np.all(q[:, [0, 2, 3]] == 0) and np.all(np.isfinite(scale))
    np.testing.assert_allclose(q[:, 1] * scale[1], weight[:, 1], atol=1.0 / 127)


@pytest.mark.parametrize("ep", ["OpenVINOExecutionProvider", "CPUExecutionProvider"])
def test_linear_with_int8_weights_runs_on_both_providers(ep: str) -> None:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((16, 32)).astype(np.float32)  # [out, in]
    bias = rng.standard_normal(16).astype(np.float32)
    g = GraphBuilder("linear", WeightFormat("float16", int8_matrices=True))
    x = g.input("x", np.float32, [2, 32])
    g.output(g.linear(x, weight, bias, "fc"), "y", np.float32, [2, 16])
    model = g.model()
    stored = {t.name: t.data_type for t in model.graph.initializer}
    assert stored["fc.weight_t"] == onnx.TensorProto.INT8
    assert stored["fc.bias"] == onnx.TensorProto.FLOAT16
    options = ort.SessionOptions()
    if ep == "OpenVINOExecutionProvider":  # every node on OpenVINO, none left to the CPU EP
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=[ep])
    assert session.get_providers()[0] == ep
    inputs = rng.standard_normal((2, 32)).astype(np.float32)
    (got,) = session.run(None, {"x": inputs})
    q, scale = quantize_int8(weight.T, axis=1)
    dequantized = inputs @ (q * scale) + bias.astype(np.float16)
    # OpenVINO may also quantize the activations on the fly (int8 dot products): ~0.5 % off
    assert np.abs(got - dequantized).max() < 0.01 * np.abs(dequantized).max()
    exact = inputs @ weight.T + bias
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max()
