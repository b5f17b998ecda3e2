"""Where and how a graph runs: the execution provider and device (an explicit policy: AUTO = NPU,
else GPU, else CPU as OpenVINO reports them; a device asked for by name that is missing is an
error, never a silent CPU fallback), the inference precision, the OpenVINO properties that follow
from them and the CPU kind, the arithmetic each stage runs (for `/health` and the log), and
`open_graph`, which opens one graph so.

NPU emulation (`RuntimeOptions.npu_emulation`, for machines without an NPU: CI, development) runs
the NPU device through OpenVINO's NPU plugin with its own partitioner (NPUW) and the CPU as its
worker, as openvino.genai's own NPU tests do: the plugin, static shapes and compile path of a
real NPU, with the CPU computing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.runtime.cpu_kind import CpuKind, this_cpu
from app.runtime.graphs import (
    FLOAT_INT8_INPUTS,
    Graph,
    OpenVINOGraph,
    OrtGraph,
    openvino_core,
    openvino_devices,
)

EXECUTION_PROVIDERS = ("openvino", "cpu")
DEVICES = ("AUTO", "NPU", "GPU", "CPU")
_AUTO_ORDER = ("NPU", "GPU", "CPU")
# the NPU plugin's own partitioner with the CPU as its worker: an NPU without an NPU
NPU_EMULATION = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", "NPUW_ONLINE_PIPELINE": "NONE"}
# ... whose CPU worker compiles with the CPU plugin's defaults, set so: f32 (under bf16 OpenVINO
# 2025.4's CPU plugin fails on the static-shape decoder: "BrgemmCPU node has incompatible input
# element types"), no dynamic activation quantization (the CPU default on f32 quantizes the int8
# layers' inputs per token and changed 2 of the 7 English clips' words against the CPU path), the
# int8-input layers exact on this CPU kind as on the CPU device (checked under
# ONEDNN_MAX_CPU_ISA=AVX2: off their grid without, exact with)
NPU_EMULATION_WORKER = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
STATIC_ROWS = (1, 5)  # decoder rows a static device compiles: greedy; 5 beams or samples


class DeviceError(RuntimeError):
    """The requested execution provider or device is not available here."""


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a model runs.

    threads: intra-op threads per session (0 = ONNX Runtime's default: one per core).
    inference_precision: OpenVINO `INFERENCE_PRECISION_HINT` ("bf16", "f16", "f32"); None = the
        device's default; "auto" = bf16 on a CPU with native bf16 (AVX-512 BF16 or AMX), else None.
    activation_quantization: OpenVINO CPU, int8 weight files: "on" = the int8 linear layers
        quantize their inputs too, per token in groups of 32 (int8 x int8 products, as
        CTranslate2's int8 does); "off" = the weights are expanded inside an f32/bf16 product;
        "auto" = off (it changes words on today's files: `_activation_groups`).
    npu_emulation: the NPU device runs through the NPU plugin with NPUW on the CPU (`NPU` is
        then available even where OpenVINO reports none).
    static_rows: the decoder row counts a static device (NPU) compiles at load; calls of other
        row counts are padded or split onto them (`static_shapes`).
    static_batch_rows: ... and the row counts of batched steps it compiles (a row per window,
        `static_shapes.batch_rows`); none without cross-request batching.
    """

    ep: str = "openvino"
    device: str = "AUTO"
    encoder_device: str | None = None
    decoder_device: str | None = None
    threads: int = 0
    cache_dir: Path | None = None
    inference_precision: str | None = None
    activation_quantization: str = "auto"
    npu_emulation: bool = False
    static_rows: tuple[int, ...] = STATIC_ROWS
    static_batch_rows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.ep not in EXECUTION_PROVIDERS:
            raise DeviceError(f"unknown execution provider {self.ep!r}: use openvino or cpu")
        for device in (self.device, self.encoder_device, self.decoder_device):
            if device is not None and device.split(".")[0].upper() not in DEVICES:
                raise DeviceError(f"unknown device {device!r}: use one of {', '.join(DEVICES)}")
        if self.threads < 0:
            raise DeviceError("threads must be >= 0")
        if self.activation_quantization not in ACTIVATION_QUANTIZATION:
            raise DeviceError(
                f"unknown activation quantization {self.activation_quantization!r}: "
                f"use {', '.join(ACTIVATION_QUANTIZATION)}"
            )
        if self.inference_precision not in (None, *PRECISIONS):
            raise DeviceError(
                f"unknown precision {self.inference_precision!r}: use {', '.join(PRECISIONS)}"
            )


def available_devices(options: RuntimeOptions) -> list[str]:
    """The OpenVINO devices `options` can place a graph on here (the emulated NPU included)."""
    found = openvino_devices()
    if options.npu_emulation and not any(d.split(".")[0] == "NPU" for d in found):
        found.append("NPU")
    return found


def resolve_device(requested: str, available: list[str]) -> str:
    """The OpenVINO device_type to use for `requested` (AUTO or a name) given `available`."""
    requested = requested.upper()
    families = {d.split(".")[0]: d for d in reversed(available)}
    if requested == "AUTO":
        for family in _AUTO_ORDER:
            if family in families:
                return family
        raise DeviceError(f"OpenVINO reports no usable device (found: {available or 'none'})")
    if requested in available or requested in families:
        return requested
    raise DeviceError(
        f"device {requested} was asked for but OpenVINO reports only: "
        f"{', '.join(available) or 'no devices'}"
    )


PRECISIONS = ("auto", "bf16", "f16", "f32")
ACTIVATION_QUANTIZATION = ("auto", "on", "off")
ACTIVATION_GROUP = 32  # inputs per quantization scale when activations are quantized


def _activation_groups(activation_quantization: str) -> int:
    """OpenVINO CPU's `DYNAMIC_QUANTIZATION_GROUP_SIZE` for int8 weights (0 = off).

    Measured on a CPU without native bf16 (f32 compute, `benchmarks/results/decoder_state.md`):
    on, the int8 linear layers take 1.5 instead of 2.3 ms of a tiny.en step, the 60 s clip
    decodes 20-30 % faster with the same words, and a row's logits are the same bit for bit alone
    or packed with others (off: they differ by ~1e-5). Under bf16 (measured on a CPU with
    AVX-512 BF16) it gave no speed and the logits depend on the call's row count, so auto = off
    there. Without int8 dot products (AVX2 only) OpenVINO does not apply it. And with today's
    files (the smoothed int8 encoder, the int8 logits projection) it changes words: on the
    AVX-512 VNNI and AVX2 + AVX-VNNI kinds (held by ONEDNN_MAX_CPU_ISA, 2026-12-02) tiny.en read
    "stuff it" where the exact computation reads "stuffed it" (`benchmarks/results/cpu_kinds.md`),
    so its speed does not count: auto = off on every kind, "on" only when asked (a row's logits
    then differ by ~1e-5 with the rows beside it, as under bf16)."""
    return ACTIVATION_GROUP if activation_quantization == "on" else 0


def openvino_properties(
    device: str,
    precision: str | None,
    activation_quantization: str = "auto",
    threads: int = 0,
    cache_dir: Path | None = None,
    kind: CpuKind | None = None,
    npu_emulation: bool = False,
) -> dict[str, str]:
    """OpenVINO compile properties for one graph on `device`, for the CPU `kind` (default: this
    one, as `ONEDNN_MAX_CPU_ISA` holds it); npu_emulation: the NPU through NPUW on the CPU."""
    kind = kind or this_cpu()
    family = device.split(".")[0]
    properties: dict[str, str] = {}
    precision = resolved_precision(device, precision, kind)
    if precision:
        properties["INFERENCE_PRECISION_HINT"] = precision
    if family == "CPU":
        groups = _activation_groups(activation_quantization)
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(groups)
        properties.update(int8_input_properties(kind))
        if threads:
            properties["INFERENCE_NUM_THREADS"] = str(threads)
    if family == "NPU" and npu_emulation:
        properties.update(NPU_EMULATION)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        properties["CACHE_DIR"] = str(cache_dir)
    return properties


def int8_input_properties(kind: CpuKind | None = None) -> dict[str, str]:
    """OpenVINO CPU properties for int8-input layers on the CPU `kind` (default: this one): none
    where it has int8 dot products, else those that run such layers in float on their int8 grids
    (`graphs.FLOAT_INT8_INPUTS`)."""
    return {} if (kind or this_cpu()).int8_dot_products else dict(FLOAT_INT8_INPUTS)


def resolved_precision(
    device: str, precision: str | None, kind: CpuKind | None = None
) -> str | None:
    """The precision a graph computes in on `device`: "auto" = bf16 on a CPU with native bf16;
    None (or "auto" elsewhere) = f32 on a CPU (named: OpenVINO's own CPU default is bf16 where
    the CPU has it), the device's default on GPU and NPU (None)."""
    cpu = device.split(".")[0] == "CPU"
    if precision == "auto" and cpu and (kind or this_cpu()).native_bf16:
        return "bf16"
    if precision in ("auto", None):
        return "f32" if cpu else None
    return precision


def arithmetic(
    ep: str,
    device: str,
    precision: str | None,
    int8_inputs: bool,
    kind: CpuKind | None = None,
    npu_emulation: bool = False,
) -> str:
    """What a graph computes in, as `/health` and the start-up log say it: e.g. "bf16, int8
    inputs int8 x int8 (AVX-512 BF16 + AMX)", "f32, int8 inputs in float on their int8 grids
    (AVX2)". int8_inputs: the model's files have int8-input layers."""
    kind = kind or this_cpu()
    family = device.split(".")[0]
    if ep == "cpu":
        compute = "f32"
    else:
        compute = resolved_precision(device, precision, kind) or f"the {family} default"
    if ep == "openvino" and family == "NPU" and npu_emulation:
        how = "in float on their int8 grids" if not kind.int8_dot_products else "int8 x int8"
        inputs = f", int8 inputs {how}" if int8_inputs else ""
        worker = NPU_EMULATION_WORKER["INFERENCE_PRECISION_HINT"]
        return f"{worker}{inputs}; NPU emulated: NPUW on the CPU ({kind.name})"
    if not int8_inputs:
        return compute
    if ep == "openvino" and family != "CPU":
        return f"{compute}, int8 inputs as the {family} plugin runs them"
    how = "int8 x int8" if kind.int8_dot_products else "in float on their int8 grids"
    return f"{compute}, int8 inputs {how} ({kind.name})"


def open_graph(
    path: Path,
    ep: str,
    device: str,
    threads: int,
    cache_dir: Path | None = None,
    inference_precision: str | None = None,
    activation_quantization: str = "auto",
    bf16_ports: tuple[str, ...] = (),
    shrink_arena: bool = False,
    static_shapes: Sequence[Mapping[str, Sequence[int]]] = (),
    npu_emulation: bool = False,
) -> Graph:
    """A graph on OpenVINO (`ep="openvino"`, on `device`) or ONNX Runtime's CPU provider
    (`ep="cpu"`); `bf16_ports` (OpenVINO) are the inputs and outputs handed over as bf16;
    `shrink_arena` (ONNX Runtime; OpenVINO has no such arena): `OrtGraph`'s; `static_shapes`:
    the shapes a static device compiles now (`OpenVINOGraph`)."""
    try:
        if ep == "cpu":
            int8 = this_cpu().int8_dot_products
            return OrtGraph(path, threads, float_int8_inputs=not int8, shrink_arena=shrink_arena)
        properties = openvino_properties(
            device,
            inference_precision,
            activation_quantization,
            threads,
            cache_dir,
            npu_emulation=npu_emulation,
        )
        if npu_emulation and device.split(".")[0] == "NPU":
            openvino_core().set_property("CPU", NPU_EMULATION_WORKER | int8_input_properties())
        return OpenVINOGraph(path, device, properties, bf16_ports, static_shapes)
    except Exception as e:  # onnxruntime's Fail/InvalidProtobuf/... derive from Exception only
        raise DeviceError(f"cannot load {path.name} on {ep}/{device}: {e}") from e
