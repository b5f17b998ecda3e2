"""Device and precision policy of the runtime (no model needed)."""

from __future__ import annotations

import pytest

from app.runtime.cpu_kind import cpu_flags, kind_of
from app.runtime.placement import (
    DeviceError,
    RuntimeOptions,
    arithmetic,
    openvino_properties,
    resolve_device,
)
from tests.cpu_lanes import lanes


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
    with pytest.raises(DeviceError, match="activation quantization"):
        RuntimeOptions(activation_quantization="int4")


BF16_CPU = kind_of(frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), None)
VNNI_CPU = kind_of(frozenset({"avx2", "avx512f", "avx512_vnni"}), None)
AVX2_CPU = kind_of(frozenset({"avx2", "fma"}), None)


def test_auto_precision_follows_the_cpu_kind() -> None:
    off = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    on = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}
    assert openvino_properties("CPU", "auto", kind=BF16_CPU) == {
        "INFERENCE_PRECISION_HINT": "bf16",  # bf16: activations stay bf16
        **off,
    }
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}  # named: OpenVINO's own default there is bf16
    assert openvino_properties("CPU", None, kind=BF16_CPU).items() >= f32.items()
    assert openvino_properties("GPU", "auto", kind=BF16_CPU) == {}
    # activation quantization changes words on the VNNI kinds: off unless asked for
    assert openvino_properties("CPU", "auto", kind=VNNI_CPU) == {**f32, **off}
    assert openvino_properties("CPU", None, kind=VNNI_CPU) == {**f32, **off}
    assert openvino_properties("CPU", "f32", "off", kind=VNNI_CPU) == {**f32, **off}
    bf16 = {"INFERENCE_PRECISION_HINT": "bf16"}
    assert openvino_properties("CPU", "bf16", "on", kind=VNNI_CPU) == {**bf16, **on}
    assert openvino_properties("NPU", "f16", kind=AVX2_CPU) == {"INFERENCE_PRECISION_HINT": "f16"}


def test_without_int8_dot_products_int8_inputs_are_computed_in_float() -> None:
    float_int8 = {"LP_TRANSFORMS_MODE": "NO"}
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}
    off = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    assert openvino_properties("CPU", "auto", kind=AVX2_CPU) == {**f32, **off, **float_int8}
    asked = openvino_properties("CPU", None, "on", kind=AVX2_CPU)  # asked for: as asked
    assert asked == {**f32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32", **float_int8}
    for kind in (BF16_CPU, VNNI_CPU):
        assert "LP_TRANSFORMS_MODE" not in openvino_properties("CPU", "auto", kind=kind)
    assert "LP_TRANSFORMS_MODE" not in openvino_properties("GPU", "auto", kind=AVX2_CPU)
    assert arithmetic("openvino", "CPU", "auto", True, AVX2_CPU) == (
        "f32, int8 inputs in float on their int8 grids (AVX2)"
    )
    assert arithmetic("openvino", "CPU", "auto", True, BF16_CPU) == (
        "bf16, int8 inputs int8 x int8 (AVX-512 BF16)"
    )
    assert arithmetic("cpu", "CPU", "auto", False, BF16_CPU) == "f32"
    assert arithmetic("openvino", "NPU", None, True, AVX2_CPU) == (
        "the NPU default, int8 inputs as the NPU plugin runs them"
    )


@pytest.mark.parametrize(
    ("flags", "cap", "dot_products", "bf16", "name"),
    [
        ("avx2 fma", None, False, False, "AVX2"),  # AMD Zen 1-3, Intel before Ice Lake
        ("avx2 avx_vnni", None, True, False, "AVX2 + AVX-VNNI"),  # Core Ultra, N100
        ("avx2 avx512f", None, False, False, "AVX-512 without VNNI"),  # Skylake-SP
        ("avx2 avx512f avx512_vnni", None, True, False, "AVX-512 VNNI"),
        ("avx2 avx512f avx512_vnni avx512_bf16", None, True, True, "AVX-512 BF16"),
        ("avx2 avx512f avx512_vnni avx512_bf16 amx_int8 amx_bf16", None, True, True, "AMX"),
        ("avx2 avx512f avx512_vnni avx512_bf16", "AVX2", False, False, "AVX2 (held by"),
        ("avx2 avx_vnni avx512f avx512_vnni", "avx2_vnni", True, False, "AVX2 + AVX-VNNI (held"),
        ("avx2 avx_vnni avx512f avx512_vnni", "AVX512_CORE", False, False, "without VNNI (held"),
        ("avx2 avx512f avx512_vnni amx_int8 amx_bf16", "AVX512_CORE_VNNI", True, False, "VNNI ("),
        ("avx2 avx512f", "AVX512_CORE_AMX", False, False, "AVX-512 without VNNI (held"),
        ("avx2 avx512f avx512_vnni", "NOT_AN_ISA", True, False, "AVX-512 VNNI"),  # ignored
    ],
)
def test_the_cpu_kind_is_what_the_flags_allow_under_the_isa_cap(
    flags: str, cap: str | None, dot_products: bool, bf16: bool, name: str
) -> None:
    kind = kind_of(frozenset(flags.split()), cap)
    assert (kind.int8_dot_products, kind.native_bf16) == (dot_products, bf16)
    assert name in kind.name


def test_cpu_flags_are_read_from_cpuinfo() -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\nbugs\t\t: spectre\n"
    assert cpu_flags(text) == frozenset({"fpu", "avx2", "avx512_vnni"})
    assert cpu_flags("") == frozenset()


def test_threads_and_cache_reach_openvino(tmp_path) -> None:
    cpu = openvino_properties("CPU", "f32", threads=2, cache_dir=tmp_path / "cache")
    assert cpu["INFERENCE_NUM_THREADS"] == "2"
    assert cpu["CACHE_DIR"] == str(tmp_path / "cache") and (tmp_path / "cache").is_dir()
    assert "INFERENCE_NUM_THREADS" not in openvino_properties("GPU", None, threads=2)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("avx2 fma", []),  # an AVX2-only CPU is its own and only kind
        ("avx2 avx512f avx512_vnni", ["AVX2 whole", "AVX512_CORE"]),  # a Xeon with VNNI, no bf16
        (
            "avx2 avx512f avx512_vnni avx512_bf16",
            ["AVX2 whole", "AVX512_CORE", "AVX512_CORE_VNNI whole"],
        ),
        (
            "avx2 avx_vnni avx512f avx512_vnni avx512_bf16 amx_int8 amx_bf16",
            [
                *("AVX2 whole", "AVX2_VNNI whole"),
                *("AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16"),
            ],
        ),
    ],
)
def test_make_test_cpus_runs_each_kind_once_and_some_tests_once_per_arithmetic(
    flags, expected
) -> None:
    chosen = lanes(kind_of(frozenset(flags.split()), None))
    assert [f"{lane.cap}{' whole' * lane.whole}" for lane in chosen] == expected
