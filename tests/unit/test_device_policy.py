"""Device and precision policy of the runtime (no model needed)."""

from __future__ import annotations

import pytest

from app.runtime import sessions
from app.runtime.sessions import DeviceError, RuntimeOptions, openvino_properties, resolve_device


@pytest.mark.parametrize(
    ("requested", "available", "expected"),
    [
        ("AUTO", ["CPU"], "CPU"),
        ("AUTO", ["CPU", "GPU.0", "NPU"], "NPU"),
        ("AUTO", ["CPU", "GPU.0", "GPU.1"], "GPU"),
        ("gpu", ["CPU", "GPU.0"], "GPU"),
        ("GPU.1", ["CPU", "GPU.0", "GPU.1"], "GPU.1"),
        ("CPU", ["CPU", "NPU"], "CPU"),
    ],
)
def test_resolve_device(requested: str, available: list[str], expected: str) -> None:
    assert resolve_device(requested, available) == expected


def test_missing_device_names_what_was_found() -> None:
    with pytest.raises(DeviceError, match="device NPU was asked for but OpenVINO reports only: CP"):
        resolve_device("NPU", ["CPU"])


def test_bad_options_are_refused() -> None:
    with pytest.raises(DeviceError, match="unknown device"):
        RuntimeOptions(device="TPU")
    with pytest.raises(DeviceError, match="unknown execution provider"):
        RuntimeOptions(ep="cuda")
    with pytest.raises(DeviceError, match="unknown precision"):
        RuntimeOptions(inference_precision="int4")


def test_auto_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    off = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    on = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}
    monkeypatch.setattr(sessions, "cpu_has_native_bf16", lambda: True)
    assert openvino_properties("CPU", "auto") == {
        "INFERENCE_PRECISION_HINT": "bf16",  # bf16: activations stay bf16
        **off,
    }
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}  # named: OpenVINO's own default there is bf16
    assert openvino_properties("CPU", None).items() >= f32.items()
    assert openvino_properties("GPU", "auto") == {}
    monkeypatch.setattr(sessions, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: True)
    assert openvino_properties("CPU", "auto") == {**f32, **on}  # int8 x int8 products
    assert openvino_properties("CPU", None) == {**f32, **on}
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: False)
    assert openvino_properties("CPU", "auto") == {**f32, **off}  # AVX2 only: not applied
    assert openvino_properties("CPU", None, "on") == {**f32, **on}  # asked for: as asked
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: True)
    assert openvino_properties("CPU", "f32", "off") == {
        "INFERENCE_PRECISION_HINT": "f32",
        **off,
    }
    assert openvino_properties("CPU", "bf16", "on") == {
        "INFERENCE_PRECISION_HINT": "bf16",
        **on,
    }
    assert openvino_properties("NPU", "f16") == {"INFERENCE_PRECISION_HINT": "f16"}
    with pytest.raises(DeviceError, match="activation quantization"):
        RuntimeOptions(activation_quantization="int4")


def test_threads_and_cache_reach_openvino(tmp_path) -> None:
    cpu = openvino_properties("CPU", "f32", threads=2, cache_dir=tmp_path / "cache")
    assert cpu["INFERENCE_NUM_THREADS"] == "2"
    assert cpu["CACHE_DIR"] == str(tmp_path / "cache") and (tmp_path / "cache").is_dir()
    assert "INFERENCE_NUM_THREADS" not in openvino_properties("GPU", None, threads=2)
