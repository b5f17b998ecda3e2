"""Linear layers with int8 inputs (GraphBuilder.linear(int8_input=True)) and their calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from app.export.graph_builder import RANGE_OUTPUT, GraphBuilder, WeightFormat
from app.runtime.graphs import openvino_core
from app.runtime.sessions import open_graph

INT8 = WeightFormat("float16", int8_matrices=True, int8_inputs=True)
ROWS, IN, OUT = 64, 256, 128


def _weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, IN)).astype(np.float32)
    weight = rng.standard_normal((OUT, IN)).astype(np.float32)  # [out, in]
    weight *= np.logspace(-2, 0, OUT, dtype=np.float32)[:, None]  # channels of unlike ranges
    bias = rng.standard_normal(OUT).astype(np.float32)
    return x, weight, bias


def _linear_graph(path: Path, weight, bias, **builder) -> Path:
    g = GraphBuilder("linear", INT8, **builder)
    x = g.input("x", np.float32, [ROWS, IN])
    g.output(g.linear(x, weight, bias, "fc", int8_input=True), "y", np.float32, [ROWS, OUT])
    onnx.save(g.model(), path)
    return path


def _integer_reference(x, weight, bias, reach: float) -> np.ndarray:
    """What the graph computes: x on a per-tensor int8 grid (saturating at -128 and 127, as ONNX's
    QuantizeLinear does), W on a per-channel one."""
    step = np.float32(reach / 127)
    xq = np.clip(np.rint(x / step), -128, 127) * step
    w_step = (np.abs(weight).max(axis=1, keepdims=True) / 127).astype(np.float16)
    wq = np.rint(weight / w_step.astype(np.float32)) * w_step.astype(np.float32)
    return xq @ wq.T + bias.astype(np.float16).astype(np.float32)


def test_a_probe_graph_gives_each_int8_input_its_largest_magnitude(tmp_path: Path) -> None:
    x, weight, bias = _weights()
    g = GraphBuilder("probe", INT8, probe_ranges=True)
    value = g.input("x", np.float32, [ROWS, IN])
    hidden = g.linear(value, weight[:, :IN], None, "fc", int8_input=True)
    g.linear(value, weight, None, "twin", int8_input=True)  # the same input: one range
    g.output(g.linear(hidden, weight[:, :OUT], bias, "plain"), "y", np.float32, [ROWS, OUT])
    onnx.save(g.model(), tmp_path / "probe.onnx")
    graph = open_graph(tmp_path / "probe.onnx", "openvino", "CPU", 1)
    assert [n for n in graph.output_names if n.startswith(RANGE_OUTPUT)] == ["range.fc"]
    (reach,) = graph.run(["range.fc"], {"x": x})
    assert reach.shape == () and reach == pytest.approx(np.abs(x).max(), rel=1e-6)


def test_layers_reading_one_input_share_its_int8_round_trip(tmp_path: Path) -> None:
    _, weight, _ = _weights()
    g = GraphBuilder("shared", INT8, input_ranges={"first": 2.0})  # no range for "second"
    value = g.input("x", np.float32, [ROWS, IN])
    for name in ("first", "second"):
        g.output(g.linear(value, weight, None, name, int8_input=True), name, np.float32, [])
    assert [n.op_type for n in g.model().graph.node].count("QuantizeLinear") == 1


@pytest.mark.parametrize("ep", ["openvino", "cpu"])
def test_an_int8_input_linear_computes_on_the_int8_grids(ep: str, tmp_path: Path) -> None:
    x, weight, bias = _weights()
    reach = float(np.abs(x).max()) * 0.5  # half of x saturates: the range is a hard limit
    path = _linear_graph(tmp_path / "linear.onnx", weight, bias, input_ranges={"fc": reach})
    (y,) = open_graph(path, ep, "CPU", 1).run(["y"], {"x": x})
    expected = _integer_reference(x, weight, bias, reach)
    exact = x @ weight.T + bias
    # the runtime's rounding and accumulation differ from numpy's in the last bits only; the
    # error against the exact product is far larger (the clipped inputs)
    assert np.abs(y - expected).max() < 1e-5 * np.abs(expected).max()
    assert np.abs(exact - expected).max() > 0.1 * np.abs(expected).max()


def test_openvino_multiplies_an_int8_input_linear_in_int8(tmp_path: Path) -> None:
    x, weight, bias = _weights()
    path = _linear_graph(tmp_path / "linear.onnx", weight, bias, input_ranges={"fc": 4.0})
    compiled = openvino_core().compile_model(str(path), "CPU", {"PERF_COUNT": "YES"})
    request = compiled.create_infer_request()
    request.infer({"x": x})
    kinds = {(p.node_type, p.exec_type) for p in request.profiling_info}
    assert any("FullyConnected" in node and "i8" in ex.lower() for node, ex in kinds), kinds
