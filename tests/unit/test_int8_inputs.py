"""Linear layers with int8 inputs (GraphBuilder.linear(int8_input=True)), their calibration, and
the int8 table a lookup and an int8-input projection share (the decoder's tied embedding)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from app.export.graph_builder import RANGE_OUTPUT, GraphBuilder, WeightFormat
from app.export.smoothing import smoothing_factors
from app.runtime.cpu_kind import this_cpu
from app.runtime.graphs import openvino_core
from app.runtime.placement import open_graph, openvino_properties

pytestmark = pytest.mark.cpu_kind  # `make test-cpus` runs it under each CPU kind
ON_ONNX_RUNTIME = pytest.param("cpu", marks=pytest.mark.per_arithmetic)  # its kernels: the CPU's

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


def test_a_probe_graph_gives_each_int8_input_its_largest_magnitude_per_channel(
    tmp_path: Path,
) -> None:
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
    np.testing.assert_allclose(reach, np.abs(x).max(axis=0), rtol=1e-6)


def test_layers_reading_one_input_share_its_int8_round_trip(tmp_path: Path) -> None:
    _, weight, _ = _weights()
    g = GraphBuilder("shared", INT8, input_ranges={"first": 2.0})  # no range for "second"
    value = g.input("x", np.float32, [ROWS, IN])
    for name in ("first", "second"):
        g.output(g.linear(value, weight, None, name, int8_input=True), name, np.float32, [])
    assert [n.op_type for n in g.model().graph.node].count("QuantizeLinear") == 1


@pytest.mark.parametrize("ep", ["openvino", ON_ONNX_RUNTIME])
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


def test_openvino_multiplies_int8_inputs_in_int8_only_on_cpu_kinds_with_int8_dot_products(
    tmp_path: Path,
) -> None:
    x, weight, bias = _weights()
    path = _linear_graph(tmp_path / "linear.onnx", weight, bias, input_ranges={"fc": 4.0})
    properties = {**openvino_properties("CPU", "f32"), "PERF_COUNT": "YES"}
    compiled = openvino_core().compile_model(str(path), "CPU", properties)
    request = compiled.create_infer_request()
    request.infer({"x": x})
    kinds = {(p.node_type, p.exec_type) for p in request.profiling_info}
    in_int8 = any("FullyConnected" in node and "i8" in ex.lower() for node, ex in kinds)
    assert in_int8 == this_cpu().int8_dot_products, (this_cpu().name, kinds)


def _table_graph(
    path: Path, table: np.ndarray, reach: float, smoothing: np.ndarray | None = None
) -> Path:
    """ids -> the table's rows (`lookup`) through an f32 identity layer (a consumer, as the
    decoder's first LayerNorm is: a lookup fused into its consumer is where OpenVINO's bf16 Gather
    went wrong), and x -> x @ table^T (`int8_projection`)."""
    g = GraphBuilder("table", INT8, input_ranges={"proj": reach})
    ids = g.input("ids", np.int64, ["batch", "tokens"])
    x = g.input("x", np.float32, ["rows", table.shape[1]])
    stored = g.int8_table("table", table, smoothing)
    eye = g.const(np.eye(table.shape[1], dtype=np.float32))
    rows = g.op("MatMul", [g.lookup(stored, ids), eye])
    g.output(rows, "rows", np.float32, ["batch", "tokens", table.shape[1]])
    g.output(g.int8_projection(x, stored, "proj"), "y", np.float32, ["rows", len(table)])
    onnx.save(g.model(), path)
    return path


def _dequantized_rows(table: np.ndarray) -> np.ndarray:
    """The int8 table as stored (one fp16 scale per row), expanded."""
    step = (np.abs(table).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    return np.rint(table / step) * step


NATIVE_BF16 = pytest.mark.skipif(
    not this_cpu().native_bf16, reason="bf16 arithmetic needs AVX-512 BF16 or AMX"
)
PRECISIONS = ["f32", pytest.param("bf16", marks=NATIVE_BF16)]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_int8_table_gives_each_token_its_own_row_and_scale(
    precision: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(5)
    table = rng.standard_normal((OUT, IN)).astype(np.float32)
    table *= np.logspace(-2, 1, OUT, dtype=np.float32)[:, None]  # rows of unlike scales
    path = _table_graph(tmp_path / "table.onnx", table, 1.0)
    graph = open_graph(path, "openvino", "CPU", 1, inference_precision=precision)
    ids = np.array([[3, 90, 7, 127], [0, 64, 64, 5]], np.int64)
    x = np.zeros((1, IN), np.float32)
    (rows,) = graph.run(["rows"], {"ids": ids, "x": x})
    expected = _dequantized_rows(table)[ids]
    tolerance = 1e-2 if precision == "bf16" else 1e-5  # bf16 keeps 8 bits of each value
    np.testing.assert_allclose(rows, expected, rtol=tolerance, atol=0)


@pytest.mark.parametrize("ep", ["openvino", ON_ONNX_RUNTIME])
def test_an_int8_projection_computes_on_the_int8_grids(ep: str, tmp_path: Path) -> None:
    x, table, _ = _weights()
    reach = float(np.abs(x).max()) * 0.5
    path = _table_graph(tmp_path / "table.onnx", table, reach)
    ids = np.zeros((1, 1), np.int64)
    (y,) = open_graph(path, ep, "CPU", 1, inference_precision="f32").run(
        ["y"], {"ids": ids, "x": x}
    )
    step = np.float32(reach / 127)
    expected = (np.clip(np.rint(x / step), -128, 127) * step) @ _dequantized_rows(table).T
    assert np.abs(y - expected).max() < 1e-5 * np.abs(expected).max()


def test_smoothing_keeps_the_rows_and_shrinks_the_error_an_outlier_channel_causes(
    tmp_path: Path,
) -> None:
    x, table, _ = _weights()
    x[:, 7] *= 40  # one input channel far above the rest, as the decoder's final LayerNorm gives
    exact = x @ table.T
    ids = np.array([[3, 90, 7, 127]], np.int64)
    errors = {}
    smoothed = smoothing_factors(np.abs(x).max(0), [table])
    for name, smoothing in (("plain", None), ("smooth", smoothed)):
        reach = np.abs(x).max(0) if smoothing is None else np.abs(x).max(0) / smoothing
        path = _table_graph(tmp_path / f"{name}.onnx", table, float(reach.max()), smoothing)
        graph = open_graph(path, "openvino", "CPU", 1, inference_precision="f32")
        rows, y = graph.run(["rows", "y"], {"ids": ids, "x": x})
        # a lookup gives the table's rows either way, to within half an int8 step of the stored
        # (smoothed) row, divided by the column's smoothing
        s = np.ones(IN, np.float32) if smoothing is None else smoothing
        step = np.abs(table * s).max(axis=1, keepdims=True) / 127
        bound = 0.501 * step[ids] / s
        assert (np.abs(rows - table[ids]) <= bound).all()
        errors[name] = np.abs(y - exact).mean()
    assert errors["smooth"] < 0.25 * errors["plain"], errors  # measured: 0.10 vs 0.68
