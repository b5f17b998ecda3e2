"""A decoder step with its K/V kept as OpenVINO state (stateful) against the service's explicit
K/V (handed in and out per call), on the CPU and on the NPU plugin with NPUW on the CPU.

The stateful graphs are made here, from the model folder's own `decoder.onnx`, the way
optimum-intel makes openvino.genai's stateful Whisper decoder: every past self K/V input becomes
a variable read (`ReadValue`), reordered by a `beam_idx` input (`Gather`), whose concatenation
with the step's new K/V is written back (`Assign`); the window's cross K/V become variables too,
written once per window (`query_state`). Two shapes of state:

- growing: the self K/V variables grow by a token per step (the LLM pattern; dynamic shapes);
- static: 448 slots from the start, the step's K/V scattered into slot `position` (fixed shapes,
  what a static-shape device compiles).

Explicit: the service's own caches (`concat` on the CPU, `static` on the NPU), through
`WhisperSessions`. Every setup decodes the first 30 s window of the 60 s earnings clip greedily
(no timestamps) for `--steps` steps, one row and five rows (the same tokens on every row, reordered
each step by a rotating `beam_idx`), computing f32 as the emulated NPU's CPU worker does; ms per
step are medians over `--runs` alternating rounds. Handed = the inputs given to the runtime per
call (the cross K/V included where they are inputs); for the stateful graphs, the window's cross
K/V are written once and not counted per step.

    .venv/bin/python -m benchmarks.stateful_step --models tiny.en,base

Writes benchmarks/results/stateful_step.md (`--out-name`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import common
from benchmarks.common import REPO


def stateful_decoder(path: Path, dims, growing: bool):
    """`decoder.onnx` with its self and cross K/V as variables (module docstring)."""
    import openvino as ov
    import openvino.opset13 as op
    from openvino.op.util import Variable, VariableInfo

    from app.runtime.contract import encoder_output_names, past_names

    model = ov.Core().read_model(str(path))
    params = {p.get_friendly_name(): p for p in model.get_parameters()}
    beam = op.parameter([-1], np.int32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    rows = op.gather(op.shape_of(params["input_ids"]), op.constant(np.array([0])), 0)
    position = op.reshape(
        op.gather(params["position_ids"], op.constant(np.array([0])), 0), [1], False
    )
    sinks = []
    slots = dims.n_text_ctx

    def variable(name: str, shape: list[int]) -> Variable:
        info = VariableInfo()
        info.data_shape = ov.PartialShape(shape)
        info.data_type = ov.Type.f32
        info.variable_id = name
        return Variable(info)

    for name in encoder_output_names(dims.n_text_layer):
        shape = [1, dims.n_heads, dims.n_audio_ctx, dims.head_dim]
        var = variable(name, shape)
        read = op.read_value(op.broadcast(op.constant(np.float32(0)), shape), var)
        for target in list(params[name].output(0).get_target_inputs()):
            target.replace_source_output(read.output(0))
        sinks.append(op.assign(read, var))
        model.remove_parameter(params[name])
    for name in past_names(dims.n_text_layer):
        past = params[name]
        held = -1 if growing else slots
        var = variable(name, [-1, dims.n_heads, held, dims.head_dim])
        start = op.concat(
            [rows, op.constant(np.array([dims.n_heads, 0 if growing else slots, dims.head_dim]))],
            0,
        )
        state = op.gather(op.read_value(op.broadcast(op.constant(np.float32(0)), start), var),
                          beam, 0)  # fmt: skip
        targets = list(past.output(0).get_target_inputs())
        for target in targets:
            target.replace_source_output(state.output(0))
        (concat,) = [t.get_node() for t in targets if t.get_node().get_type_name() == "Concat"]
        if growing:
            sinks.append(op.assign(concat, var))
        else:  # the new token's K/V (the concat's second input) into slot `position`
            new = concat.input_value(1)
            sinks.append(op.assign(op.scatter_update(state, position, new, 2), var))
        model.remove_parameter(past)
    for result in list(model.get_results()):
        if any(n.startswith("new_") for n in result.output(0).get_names()):
            model.remove_result(result)
    model.add_parameters([beam])
    model.add_sinks(sinks)
    model.validate_nodes_and_infer_types()
    return model


class Stateful:
    """One stateful graph compiled on a device; `decode` runs the greedy loop."""

    def __init__(
        self, folder: Path, dims, device: str, growing: bool, threads: int, precision: str
    ) -> None:
        import openvino as ov

        from app.runtime.placement import (
            NPU_EMULATION_WORKER,
            int8_input_properties,
            openvino_properties,
        )

        model = stateful_decoder(folder / "decoder.onnx", dims, growing)
        # as the service's explicit graphs, no activation quantization
        properties = openvino_properties(device, precision, "off", threads, npu_emulation=True)
        core = ov.Core()
        if device == "NPU":
            core.set_property("CPU", NPU_EMULATION_WORKER | int8_input_properties())
        self.dims, self.growing, self.device = dims, growing, device
        self.core, self.model, self.properties = core, model, properties
        self._compiled: dict[int, object] = {}

    def _request(self, rows: int):
        compiled = self._compiled.get(rows)
        if compiled is None:
            model = self.model.clone()
            if self.device == "NPU":  # fixed shapes: this row count, one new token
                model.reshape({"input_ids": [rows, 1], "position_ids": [rows, 1],
                               "attention_mask": [rows, self.dims.n_text_ctx + 1],
                               "logits_at": [1], "beam_idx": [rows]})  # fmt: skip
            compiled = self._compiled[rows] = self.core.compile_model(
                model, self.device, self.properties
            )
        return compiled.create_infer_request()

    def decode(self, prompt: list[int], cross: list[np.ndarray], rows: int, steps: int):
        import openvino as ov

        from app.runtime.contract import encoder_output_names

        request = self._request(rows)
        request.reset_state()
        names = encoder_output_names(self.dims.n_text_layer)
        for state in request.query_state():  # the window's cross K/V, once
            if state.name in names:
                value = cross[names.index(state.name)].astype(np.float32)  # f32 variables
                state.state = ov.Tensor(np.ascontiguousarray(value))
        slots = self.dims.n_text_ctx
        tokens = np.array([prompt] * rows, np.int64)
        done, out, times, handed = 0, [], [], 0
        while len(out) < steps:
            n = tokens.shape[1]
            new = n - done if self.growing else 1
            mask = np.ones((rows, n), np.int64)
            if not self.growing:
                mask = np.zeros((rows, slots + 1), np.int64)
                mask[:, :done] = 1
                mask[:, slots] = 1
            feed = {
                "input_ids": tokens[:, done : done + new],
                "position_ids": np.broadcast_to(np.arange(done, done + new), (rows, new)).copy(),
                "attention_mask": mask,
                "logits_at": np.array([new - 1]),
                "beam_idx": np.roll(np.arange(rows, dtype=np.int32), 1),
            }
            started = time.perf_counter()
            logits = request.infer(feed)["logits"]
            times.append(time.perf_counter() - started)
            handed = sum(a.nbytes for a in feed.values())
            done += new
            if done < n:  # a static prompt goes in a token a call
                continue
            token = int(logits[0, -1].argmax())
            out.append(token)
            tokens = np.concatenate([tokens, np.full((rows, 1), token)], 1)
        return out, times, handed


def explicit(sessions, prompt: list[int], cross, rows: int, steps: int, mode: str):
    """The service's own cache (`mode`) through `sessions`, greedy."""
    from app.engine.kv_cache import make_cache

    cache = make_cache(mode, sessions, cross, rows)
    tokens = np.array([prompt] * rows, np.int64)
    out, times = [], []
    while len(out) < steps:
        calls, started = cache.calls, time.perf_counter()
        logits = cache.forward(tokens)
        times.append((time.perf_counter() - started) / (cache.calls - calls))
        token = int(logits[0, -1].argmax())
        out.append(token)
        tokens = np.concatenate([tokens, np.full((rows, 1), token)], 1)
        cache.reorder(np.roll(np.arange(rows), 1))
    return out, times, cache.handed_nbytes / cache.calls


def measure(model: str, threads: int, runs: int, steps: int, precision: str) -> list[list]:
    """precision "f32": the CPU and the NPU (its CPU worker computes f32); otherwise the CPU
    only, at that precision ("auto": the service's CPU path, bf16 where native)."""
    from app.engine.audio import decode_audio
    from app.engine.mel import log_mel_spectrogram, pad_or_trim
    from app.runtime.contract import Manifest
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions

    folder = REPO / "models" / model
    manifest = Manifest.load(folder)
    dims, special = manifest.dims, manifest.special
    prompt = [special.sot, special.no_timestamps]
    if manifest.multilingual:
        prompt = [special.sot, manifest.language_ids["en"], special.transcribe,
                  special.no_timestamps]  # fmt: skip
    audio = decode_audio(common.EARNINGS)
    mel = pad_or_trim(log_mel_spectrogram(audio, dims.n_mels))[None].astype(np.float32)
    setups, cross = {}, []
    devices = ("CPU", "NPU") if precision == "f32" else ("CPU",)
    for device in devices:
        mode = {"CPU": "concat", "NPU": "static"}[device]
        options = RuntimeOptions(device=device, threads=threads, inference_precision=precision,
                                 activation_quantization="off",
                                 npu_emulation=device == "NPU")  # fmt: skip
        sessions = WhisperSessions.load(folder, options)
        cross = cross or sessions.encode(mel)
        setups[f"{device}, explicit ({mode} cache)"] = lambda rows, s=sessions, m=mode, c=cross: (
            explicit(s, prompt, c, rows, steps, m)
        )
    for device in devices:
        for growing in (True, False) if device == "CPU" else (False,):
            graph = Stateful(folder, dims, device, growing, threads, precision)
            name = f"{device}, stateful ({'growing' if growing else '448 slots'})"
            setups[name] = lambda rows, g=graph: g.decode(prompt, cross, rows, steps)
    seen: dict[tuple[str, int], dict] = {}
    for r in range(-1, runs):
        for name in common.rotate(list(setups), max(r, 0)):
            for rows in (1, 5):
                entry = seen.setdefault((name, rows), {"ms": []})
                if "error" in entry:
                    continue
                try:
                    tokens, times, handed = setups[name](rows)
                except RuntimeError as e:
                    text = " ".join(str(e).split())
                    entry["error"] = text[text.find("Node ") :][:160]
                    print(f"[{model}] {name} x{rows}: {entry['error']}", file=sys.stderr)
                    continue
                if r >= 0:
                    entry["ms"].append(1e3 * statistics.median(times))
                entry |= {"tokens": tokens, "handed": handed}
    reference = seen[("CPU, explicit (concat cache)", 1)]["tokens"]
    out = []
    for (name, rows), entry in seen.items():
        if "error" in entry:
            out.append([model, name, rows, "fails", "", "", entry["error"]])
            continue
        same = "yes" if entry["tokens"] == reference else "no"
        out.append([model, name, rows, f"{statistics.median(entry['ms']):.2f}",
                    f"{entry['handed'] / 1e6:.3f}", same, ""])  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument(
        "--precision",
        default="f32",
        help="f32: CPU and NPU (its worker computes f32); auto/bf16: the CPU only, as the "
        "service's CPU path computes",
    )
    p.add_argument("--out-name", default="stateful_step.md")
    common.add_args(p)
    args = p.parse_args()
    load = common.start_load(args)
    rows = [
        r
        for m in args.models.split(",")
        for r in measure(m, args.threads, args.runs, args.steps, args.precision)
    ]
    lines = common.header(
        "A decoder step: K/V as OpenVINO state vs handed per call, CPU and NPU (NPUW on the CPU)",
        load,
        [
            f"{args.threads} threads, {args.precision}, {args.steps} greedy steps on the first "
            f"window of the 60 s earnings clip, medians of {args.runs} alternating rounds after a "
            "warm-up. "
            "Same tokens = the first row's tokens equal the CPU explicit path's at 1 row.",
        ],
    )
    head = ["model", "setup", "rows", "ms/step", "handed MB/call", "same tokens", "error"]
    common.write(args.out_dir / args.out_name, [*lines, "", *common.table(head, rows)])


if __name__ == "__main__":
    main()
