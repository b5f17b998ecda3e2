"""One ONNX graph, ready to run: on OpenVINO (its own runtime: CPU, GPU, NPU) or on ONNX Runtime's
CPU provider (`ep="cpu"`, the reference). Both answer `run(output_names, feed)` as an ONNX Runtime
session does, and `run_into(feed, outputs)` writes outputs into arrays the caller owns.

OpenVINO is driven through its own API, not ONNX Runtime's OpenVINO EP: inputs are handed over as
tensors that share the numpy arrays' memory, and an input or output can be declared bfloat16
(`bf16_ports`) so a CPU that computes bf16 takes a window's cross K/V as they will be read,
with no f32 -> bf16 reorder of 18-61 MB on every decoder step (the EP refuses bf16 inputs;
`benchmarks/results/openvino_api.md`). A device that only takes static shapes (NPU) gets the graph
compiled at load for the shapes it is given (`static_shapes`: calls of other row counts are
padded or split onto them); every compile is counted (`compile_counts`, for `/metrics`).
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import ml_dtypes
import numpy as np
import onnxruntime as ort
import openvino as ov
from openvino.preprocess import PrePostProcessor

from app.runtime.static_shapes import Shapes, key_of, piece_feed, pieces, shapes_of

log = logging.getLogger(__name__)

BF16 = np.dtype(ml_dtypes.bfloat16)  # host dtype of bf16 inputs and outputs
OPENVINO = "OpenVINO"  # `Graph.provider` of graphs run by OpenVINO
ORT_CPU = "CPUExecutionProvider"  # ... and by ONNX Runtime's CPU provider
STATIC_DEVICES = ("NPU",)  # devices that compile a graph for fixed input shapes only
# What makes each runtime compute the int8-input layers in float, exactly on their int8 grids,
# for a CPU without int8 dot products (there int8 x int8 pair sums saturate: `cpu_kind`): OpenVINO
# CPU's low-precision transformations off (a QuantizeLinear/DequantizeLinear pair then runs as
# the rounding it means, the int8 weights expanded inside an f32 product), ONNX Runtime's QDQ
# fusion off. Held to AVX2 it is also the faster decoder: a base step 14.6 ms so against 19.4
# through the (saturating) int8 kernels (`benchmarks/results/cpu_kinds_speed.md`).
FLOAT_INT8_INPUTS = {"LP_TRANSFORMS_MODE": "NO"}
_ORT_FLOAT_INT8_INPUTS = ("session.disable_quant_qdq", "1")


class Graph(Protocol):
    """A loaded graph; `run` and `run_into` may be called from many threads at once."""

    provider: str
    input_names: list[str]
    output_names: list[str]

    def run(
        self, output_names: Sequence[str], feed: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]: ...

    def run_into(
        self, feed: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> None: ...


@functools.cache
def openvino_core() -> ov.Core:
    """The process's OpenVINO core (plugins load once)."""
    return ov.Core()


# (device family, "compiled" | "cache") -> graphs this process compiled or loaded compiled
_compiles: Counter[tuple[str, str]] = Counter()
_compiles_lock = threading.Lock()


def compile_counts() -> dict[tuple[str, str], int]:
    """How many graphs this process compiled, per device family and source: "compiled" (the
    plugin compiled it), "cache" (loaded from the compiled-model cache), e.g.
    {("NPU", "compiled"): 4}."""
    with _compiles_lock:
        return dict(_compiles)


def is_static(device: str) -> bool:
    """`device` compiles a graph for fixed input shapes only (NPU)."""
    return device.split(".")[0] in STATIC_DEVICES


def openvino_devices() -> list[str]:
    """Devices OpenVINO reports on this machine, e.g. ['CPU', 'GPU.0', 'NPU']."""
    return list(openvino_core().available_devices)


class OrtGraph:
    """A graph on ONNX Runtime's CPU execution provider."""

    provider = ORT_CPU

    def __init__(
        self,
        path: Path,
        threads: int,
        float_int8_inputs: bool = False,
        shrink_arena: bool = False,
        spinning: bool = True,
    ) -> None:
        """float_int8_inputs: the int8-input layers in float (`FLOAT_INT8_INPUTS`).
        shrink_arena: every run hands the CPU arena's unused memory back afterwards, for graphs
        whose activations are large and occasional (the speaker models: a 10 s CAM++ pass, 4
        segmentation windows are 100+ MB; a kept arena would hold them for good: +193 MB RSS
        kept after a 60 s segmentation and a 10 s embedding, +62 MB with shrinkage, no
        measurable time cost). spinning=False: its threads sleep as soon as a call ends (a
        graph called in bursts between other work)."""
        self._run_options = None
        if shrink_arena:
            self._run_options = ort.RunOptions()
            self._run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        options = ort.SessionOptions()
        if float_int8_inputs:
            options.add_session_config_entry(*_ORT_FLOAT_INT8_INPUTS)
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=[ORT_CPU])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]

    def run(self, output_names, feed) -> list[np.ndarray]:
        return self._session.run(list(output_names), dict(feed), self._run_options)

    def run_into(self, feed, outputs) -> None:
        binding = self._session.io_binding()
        for name, array in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, out in outputs.items():
            assert out.flags.c_contiguous, name
            binding.bind_output(name, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        self._session.run_with_iobinding(binding)


class OpenVINOGraph:
    """A graph compiled by OpenVINO for one device, with an infer request per calling thread.

    A call's inputs are bound as tensors over the caller's arrays (no copy); outputs are copied
    out (the request reuses their memory) or written into the caller's arrays (`run_into`). An
    input given as the very array object of the request's last call (a window's cross K/V, a
    cache's buffers, a batching lane's kept inputs) stays bound: a tensor is made and set only
    for a new array (`_InputBinding`)."""

    provider = OPENVINO

    def __init__(
        self,
        path: Path,
        device: str,
        properties: Mapping[str, str],
        bf16_ports: Iterable[str] = (),
        static_shapes: Iterable[Mapping[str, Sequence[int]]] = (),
    ) -> None:
        """static_shapes: on a static-shape device, the feeds' shapes to compile now (a call of
        another shape is served by them, `static_shapes.pieces`, or compiled when it meets none
        of them)."""
        model = openvino_core().read_model(str(path))
        bf16 = set(bf16_ports)
        if bf16:
            model = _declare_bf16(model, bf16)
        self._device = device
        self._properties = dict(properties)
        self.input_names = [p.get_any_name() for p in model.inputs]
        self.output_names = [p.get_any_name() for p in model.outputs]
        self._inputs = frozenset(self.input_names)  # every call binds every one
        self._output_ports = {p.get_any_name(): p for p in model.outputs}
        self._static = is_static(device)
        self._model = model if self._static else None  # reshaped and compiled per input shape
        self._compiled: dict[Shapes, ov.CompiledModel] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        if not self._static:
            self._compiled[()] = self._compile(model)
        for shapes in static_shapes if self._static else ():
            self._compiled_for(key_of(shapes))

    def _compile(self, model: ov.Model) -> ov.CompiledModel:
        compiled = openvino_core().compile_model(model, self._device, self._properties)
        try:
            cached = bool(compiled.get_property("LOADED_FROM_CACHE"))
        except RuntimeError:  # a plugin that does not say
            cached = False
        with _compiles_lock:
            _compiles[self._device.split(".")[0], "cache" if cached else "compiled"] += 1
        return compiled

    def _compiled_for(self, key: Shapes) -> ov.CompiledModel:
        """The graph compiled for the input shapes `key` (static devices), compiled now if new."""
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                assert self._model is not None
                model = self._model.clone()
                model.reshape({name: ov.PartialShape(list(shape)) for name, shape in key})
                compiled = self._compiled[key] = self._compile(model)
            return compiled

    def _request(self, key: Shapes) -> tuple[ov.InferRequest, _InputBinding]:
        requests = self._local.__dict__.setdefault("requests", {})
        found = requests.get(key)
        if found is None:
            request = self._compiled_for(key).create_infer_request()
            found = requests[key] = (request, _InputBinding(request))
        return found

    def _infer(
        self, key: Shapes, output_names: Sequence[str], feed: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        request, inputs = self._request(key)
        held = inputs.bind(feed)
        _infer_in_place(request)
        del held
        return [_copy(request.get_tensor(name)) for name in output_names]

    def _run_static(
        self, output_names: Sequence[str], feed: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        """A call on the shapes compiled for it: as it is, or padded / split onto them."""
        shapes = shapes_of(feed)
        if shapes in self._compiled:
            return self._infer(shapes, output_names, feed)
        parts = pieces(shapes, list(self._compiled))
        if not parts:
            log.warning("%s: compiling for new input shapes %s", self._device, dict(shapes))
            return self._infer(shapes, output_names, feed)
        outputs = []
        for part in parts:
            values = self._infer(part.key, output_names, piece_feed(feed, part))
            outputs.append([v[: part.stop - part.start] for v in values])
        if len(outputs) == 1:
            return outputs[0]
        return [np.concatenate(column) for column in zip(*outputs, strict=True)]

    def run(self, output_names, feed) -> list[np.ndarray]:
        self._check(feed)
        if self._static:
            return self._run_static(output_names, feed)
        return self._infer((), output_names, feed)

    def run_into(self, feed, outputs) -> None:
        if self._static:  # a device's outputs are copied to the host anyway
            for out, value in zip(outputs.values(), self.run(list(outputs), feed), strict=True):
                np.copyto(out, value)
            return
        self._check(feed)
        request, inputs = self._request(())
        held = [*inputs.bind(feed), *_bind(request, outputs)]
        try:
            _infer_in_place(request)
        finally:  # a later `run` on this request must not write into the caller's arrays
            for name in outputs:  # (a tensor of its own per request: threads never share one)
                request.set_tensor(name, _placeholder(self._output_ports[name]))
            del held

    def _check(self, feed: Mapping[str, np.ndarray]) -> None:
        """Every input, every call: one left out would be read from the last call's array."""
        if feed.keys() != self._inputs:
            raise ValueError(f"expected {sorted(self._inputs)}, got {sorted(feed)}")


class _InputBinding:
    """What an infer request's inputs are bound to: per input, a weak reference to the caller's
    array whose memory its tensor is over (none when the tensor is over a copy). A call that
    gives the same, still living, array object again needs no new tensor (~10 us a tensor);
    the reference is weak, so an array the caller dropped is not kept alive by the request,
    and a new array is never taken for it (a dead reference matches nothing)."""

    def __init__(self, request: ov.InferRequest) -> None:
        self._request = request
        self._bound: dict[str, weakref.ref] = {}

    def bind(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Bind every input (`_bind` for the new ones); returns the arrays the caller keeps alive
        while the request runs."""
        held = []
        for name, array in arrays.items():
            known = self._bound.get(name)
            if known is not None and known() is array:
                continue
            self._bound.pop(name, None)
            (bound,) = _bind(self._request, {name: array})
            if np.may_share_memory(bound, array):  # over the caller's memory, not a copy
                self._bound[name] = weakref.ref(array)
            held.append(bound)
        return held


def _infer_in_place(request: ov.InferRequest) -> None:
    """Run `request` on the tensors bound to it. Its outputs stay in its tensors (or the
    caller's arrays bound as them): `infer()` by default also copies every output into new numpy
    arrays, which nobody reads here (a window's cross K/V: 9-18 MB written to fresh pages, ~5 ms
    of a ~100 ms tiny.en encoder call)."""
    request.infer(share_outputs=True)


def _bind(request: ov.InferRequest, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Bind tensors over the arrays' memory (a copy only of one that is not contiguous or is
    read-only); returns the arrays bound, which the caller keeps alive while the request runs (a
    tensor does not hold its array)."""
    bound = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        if array.dtype == BF16:
            array = array.view(np.uint16)
            tensor = ov.Tensor(array, list(array.shape), ov.Type.bf16)
        else:
            if not array.flags.writeable:
                array = array.copy()
            tensor = ov.Tensor(array, shared_memory=True)
        request.set_tensor(name, tensor)
        bound.append(array)
    return bound


def _declare_bf16(model: ov.Model, names: set[str]) -> ov.Model:
    """`model` with the named inputs and outputs taking/giving bf16 tensors."""
    ppp = PrePostProcessor(model)
    inputs = {p.get_any_name() for p in model.inputs}
    outputs = {p.get_any_name() for p in model.outputs}
    for name in names:
        if name in inputs:
            ppp.input(name).tensor().set_element_type(ov.Type.bf16)
        elif name in outputs:
            ppp.output(name).tensor().set_element_type(ov.Type.bf16)
        else:
            raise ValueError(f"the graph has no input or output {name!r}")
    return ppp.build()


def _placeholder(port: ov.Output) -> ov.Tensor:
    """A new empty tensor of the port's type and rank (every dynamic dimension 0), which
    OpenVINO resizes as it needs: what an output is left bound to after `run_into`."""
    shape = [d.get_length() if d.is_static else 0 for d in port.get_partial_shape()]
    return ov.Tensor(port.get_element_type(), shape)


def _copy(tensor: ov.Tensor) -> np.ndarray:
    """The tensor's values as a numpy array of their own (bf16 as `BF16`)."""
    if tensor.element_type == ov.Type.bf16:
        return tensor.data.view(np.uint16).copy().view(BF16)  # .data shows bf16 bits as f16
    return tensor.data.copy()
