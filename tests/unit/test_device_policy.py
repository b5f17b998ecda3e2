"""Device and precision policy of the runtime (no model needed)."""

from __future__ import annotations

import pytest

from app.runtime import sessions
from app.runtime.sessions import DeviceError, RuntimeOptions, _openvino_config, resolve_device


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
    assert _openvino_config("CPU", "auto", False) == {
        "CPU": {"INFERENCE_PRECISION_HINT": "bf16", **off}  # bf16: activations stay bf16
    }
    decoder = _openvino_config("CPU", "auto", True)["CPU"]
    assert decoder["SNIPPETS_MODE"] == "DISABLE"  # OpenVINO 2025.4 bug with bf16 attention
    assert _openvino_config("GPU", "auto", True) == {}
    monkeypatch.setattr(sessions, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: True)
    assert _openvino_config("CPU", "auto", True) == {"CPU": on}  # f32: int8 x int8 products
    assert _openvino_config("CPU", None, True) == {"CPU": on}
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: False)
    assert _openvino_config("CPU", "auto", True) == {"CPU": off}  # AVX2 only: not applied
    assert _openvino_config("CPU", None, False, "on") == {"CPU": on}  # asked for: as asked
    monkeypatch.setattr(sessions, "cpu_has_int8_dot_products", lambda: True)
    assert _openvino_config("CPU", "f32", True, "off") == {
        "CPU": {"INFERENCE_PRECISION_HINT": "f32", **off}
    }
    assert _openvino_config("CPU", "bf16", False, "on")["CPU"] == {
        "INFERENCE_PRECISION_HINT": "bf16",
        **on,
    }
    assert _openvino_config("NPU", "f16", False) == {"NPU": {"INFERENCE_PRECISION_HINT": "f16"}}
    with pytest.raises(DeviceError, match="activation quantization"):
        RuntimeOptions(activation_quantization="int4")
