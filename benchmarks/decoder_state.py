"""Can the decoder's state stay with the runtime? Three ways of handing one step its K/V, timed.

A decoder step needs the window's cross K/V (18 MB tiny.en, 37 MB base, f32) and the past self
K/V. Three ways to hand them over through ONNX Runtime's OpenVINO EP, at one row, T = 1, after a
past of `--past` positions:

  numpy      what the service does: every call passes numpy arrays (`WhisperSessions.decode`);
  bound      IOBinding: cross and past K/V made OrtValues and bound once; per call only
             input_ids, position_ids and attention_mask are bound;
  stateful   the EP's stateful compile (`enable_causallm`): a variant of `decoder.onnx` whose
             past inputs are renamed `past_key_values_<i>` and whose outputs
             `present_key_values_<i>` are the whole cache (past + new), so OpenVINO's
             MakeStateful pass turns each pair into internal state; a window starts with
             `kvcache_rewind` = 0.

The stateful variant is checked against the stateless graph (max abs logit difference over the
steps, whole-sequence reference) and tried with 2 rows (what beams and batching need).

Second part, what the CPU computes with: the service's path (numpy) with activation quantization
off and on (`RuntimeOptions.activation_quantization`) at 1 row, 5 rows on one window (beams) and
8 rows on 8 windows (batching), and whether a row's logits alone equal the same row's in a call
of 8 (batching must not change a transcript).
Cases alternate, `--rounds` rounds of `--steps` calls; medians.

    .venv/bin/python benchmarks/decoder_state.py --models tiny.en,base

Writes benchmarks/results/decoder_state.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--past", type=int, default=100, help="positions already decoded")
    p.add_argument("--steps", type=int, default=100, help="timed calls per round and case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--skip-ways", action="store_true", help="only the second part")
    common.add_args(p)
    return p.parse_args()


def stateful_variant(model_dir: Path, n_layers: int, out: Path) -> Path:
    """decoder.onnx with past/present pairs named as the EP's stateful pass expects."""
    import onnx
    from onnx import helper

    from app.runtime import contract

    m = onnx.load(str(model_dir / "decoder.onnx"))
    g = m.graph
    past = contract.past_names(n_layers)
    rename = {name: f"past_key_values_{i}" for i, name in enumerate(past)}
    for port in g.input:
        port.name = rename.get(port.name, port.name)
    whole: dict[str, str] = {}  # renamed past input -> the Concat(past, new) output
    for node in g.node:
        for j, name in enumerate(node.input):
            if name in rename:
                node.input[j] = rename[name]
                if node.op_type == "Concat":
                    whole[rename[name]] = node.output[0]
    logits = next(o for o in g.output if o.name == "logits")
    del g.output[:]
    g.output.append(logits)
    for i in range(len(past)):
        name = f"present_key_values_{i}"
        g.node.append(helper.make_node("Identity", [whole[f"past_key_values_{i}"]], [name]))
        g.output.append(
            helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, ["b", "h", "p", "d"])
        )
    path = out / "decoder_stateful.onnx"
    onnx.save(m, str(path))
    return path


class Cases:
    """The three ways, set up on one model folder with one window's cross K/V."""

    def __init__(
        self, model_dir: Path, threads: int, past: int, scratch: Path, aq: str = "auto"
    ) -> None:
        import onnxruntime as ort

        from app.runtime import contract
        from app.runtime.sessions import RuntimeOptions, WhisperSessions, _openvino_config

        self.ort = ort
        options = RuntimeOptions(threads=threads, activation_quantization=aq)
        self.s = WhisperSessions.load(model_dir, options)
        dims = self.s.manifest.dims
        self.dims = dims
        rng = np.random.default_rng(0)
        self.cross = self.s.encode(rng.standard_normal((1, dims.n_mels, 3000)).astype(np.float32))
        self.cross_names = contract.encoder_output_names(dims.n_text_layer)
        self.past = past
        held = -(-(past + 1) // 64) * 64  # the concat cache's buffer for this past
        self.buffers = [
            np.zeros((1, dims.n_heads, held, dims.head_dim), np.float32)
            for _ in contract.past_names(dims.n_text_layer)
        ]
        self.ids = np.array([[440]], np.int64)
        self.pos = np.array([[past]], np.int64)
        self.mask = np.zeros((1, held + 1), np.int64)
        self.mask[:, :past] = 1
        self.mask[:, held:] = 1

        # bound: cross and past OrtValues bound once
        dec = self.s._decoder
        self.io = dec.io_binding()
        for name, value in zip(self.cross_names, self.cross, strict=True):
            self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
        for name, value in zip(contract.past_names(dims.n_text_layer), self.buffers, strict=True):
            self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
        self.outputs = contract.decoder_output_names(dims.n_text_layer)
        self.dec = dec

        # stateful
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 4
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ov = {"device_type": "CPU", "enable_causallm": "True"}
        if threads:
            ov["num_of_threads"] = str(threads)
        config = _openvino_config("CPU", "auto", True, aq)
        if config:
            ov["load_config"] = json.dumps(config)
        path = stateful_variant(model_dir, dims.n_text_layer, scratch)
        self.sf = ort.InferenceSession(
            str(path), options, providers=[("OpenVINOExecutionProvider", ov)]
        )
        self.n_past = 2 * dims.n_text_layer
        self.length = 0

    # -- one call of each kind ------------------------------------------------------------------

    def numpy(self) -> None:
        self.s.decode(self.ids, self.pos, self.mask, self.buffers, self.cross)

    def bound(self) -> None:
        self.io.bind_cpu_input("input_ids", self.ids)
        self.io.bind_cpu_input("position_ids", self.pos)
        self.io.bind_cpu_input("attention_mask", self.mask)
        for name in self.outputs:
            self.io.bind_output(name, "cpu")
        self.dec.run_with_iobinding(self.io)

    def stateful_feed(self, tokens: list[list[int]], start: int) -> dict[str, np.ndarray]:
        rows, t = len(tokens), len(tokens[0])
        d = self.dims
        empty = np.zeros((rows, d.n_heads, 0, d.head_dim), np.float32)
        feed = {
            "input_ids": np.asarray(tokens, np.int64),
            "position_ids": np.tile(np.arange(start, start + t, dtype=np.int64), (rows, 1)),
            "attention_mask": np.ones((rows, start + t), np.int64),
        }
        feed.update({f"past_key_values_{i}": empty for i in range(self.n_past)})
        feed.update(zip(self.cross_names, self.cross, strict=True))
        return feed

    def stateful_start(self, tokens: list[int]) -> np.ndarray:
        """A new window: rewind the state, prefill `tokens`; logits at the last position."""
        self.sf.set_ep_dynamic_options({"kvcache_rewind": "0"})
        self.length = len(tokens)
        return self.sf.run(["logits"], self.stateful_feed([tokens], 0))[0][0, -1]

    def stateful_step(self, token: int = 440) -> np.ndarray:
        logits = self.sf.run(["logits"], self.stateful_feed([[token]], self.length))[0]
        self.length += 1
        return logits[0, -1]

    def stateful(self) -> None:
        if self.length >= self.dims.n_text_ctx - 1:
            self.stateful_start([440] * self.past)
        self.stateful_step()

    # -- checks ---------------------------------------------------------------------------------

    def reference(self, tokens: list[int]) -> np.ndarray:
        """Logits at the last position from the stateless graph over the whole sequence."""
        n = len(tokens)
        d = self.dims
        empty = [np.zeros((1, d.n_heads, 0, d.head_dim), np.float32)] * self.n_past
        logits, _ = self.s.decode(
            np.asarray([tokens], np.int64),
            np.arange(n, dtype=np.int64)[None],
            np.ones((1, n), np.int64),
            empty,
            self.cross,
        )
        return logits[0, -1]

    def stateful_equivalence(self, windows: int = 2, steps: int = 12) -> float:
        """Max abs logit difference, stateful vs whole-sequence stateless, over `windows`
        windows (each starts with a rewind) of `steps` greedy steps."""
        worst = 0.0
        for _ in range(windows):
            tokens = [50257, 50362, 440]
            logits = self.stateful_start(tokens)
            for _ in range(steps):
                worst = max(worst, float(np.abs(logits - self.reference(tokens)).max()))
                tokens.append(int(np.argmax(logits)))
                logits = self.stateful_step(tokens[-1])
        return worst

    def stateful_two_rows(self) -> str:
        self.sf.set_ep_dynamic_options({"kvcache_rewind": "0"})
        try:
            self.sf.run(["logits"], self.stateful_feed([[50257, 440], [50257, 440]], 0))
        except Exception as e:  # onnxruntime's Fail
            for line in str(e).splitlines():
                if "Shape inference input shapes" in line:
                    return f"fails: {line.strip()}"
            return f"fails: {str(e).splitlines()[-1][:160]}"
        return "runs"


class RowsStep:
    """One step of R rows through `WhisperSessions.decode` with given runtime options: each row
    on its own window (distinct) or all on one batch-1 window (shared, as beams)."""

    def __init__(self, model_dir: Path, threads: int, past: int, aq: str, windows: int) -> None:
        from app.runtime.sessions import RuntimeOptions, WhisperSessions

        self.s = WhisperSessions.load(
            model_dir, RuntimeOptions(threads=threads, activation_quantization=aq)
        )
        d = self.s.manifest.dims
        rng = np.random.default_rng(1)
        features = rng.standard_normal((windows, d.n_mels, 3000)).astype(np.float32)
        self.cross = self.s.encode(features)  # [windows, H, 1500, Dh] per layer
        self.pasts = [
            rng.standard_normal((windows, d.n_heads, past, d.head_dim), dtype=np.float32)
            for _ in range(2 * d.n_text_layer)
        ]
        self.past = past

    def inputs(self, rows: int, shared: bool) -> tuple:
        ids = np.full((rows, 1), 440, np.int64)
        pos = np.full((rows, 1), self.past, np.int64)
        mask = np.ones((rows, self.past + 1), np.int64)
        if shared:
            past = [np.repeat(p[:1], rows, axis=0) for p in self.pasts]
            cross = [c[:1] for c in self.cross]
        else:
            past = [np.ascontiguousarray(p[:rows]) for p in self.pasts]
            cross = [np.ascontiguousarray(c[:rows]) for c in self.cross]
        return ids, pos, mask, past, cross

    def logits(self, inputs: tuple) -> np.ndarray:
        return self.s.decode(*inputs)[0][:, -1]


ROW_CASES = ((1, False), (5, True), (8, False))  # (rows, shared window)


def measure_aq(model: str, args: argparse.Namespace) -> dict:
    steps = {
        aq: RowsStep(REPO / "models" / model, args.threads, args.past, aq, 8)
        for aq in ("off", "on")
    }
    out: dict = {"model": model, "ms": {}, "invariance": {}}
    for rows, shared in ROW_CASES:
        inputs = {aq: s.inputs(rows, shared) for aq, s in steps.items()}
        samples: dict[str, list[float]] = {aq: [] for aq in steps}
        calls = max(10, args.steps // rows)
        for r in range(args.rounds):
            for aq in common.rotate(list(steps), r):
                for _ in range(3):
                    steps[aq].logits(inputs[aq])
                started = time.perf_counter()
                for _ in range(calls):
                    steps[aq].logits(inputs[aq])
                samples[aq].append((time.perf_counter() - started) / calls * 1e3)
        out["ms"][(rows, shared)] = {aq: statistics.median(v) for aq, v in samples.items()}
    for aq, s in steps.items():
        alone = s.logits(s.inputs(1, False))[0]
        packed = s.logits(s.inputs(8, False))[0]
        out["invariance"][aq] = float(np.abs(alone - packed).max())
    return out


def cross_bytes(c: Cases) -> int:
    return int(sum(a.nbytes for a in c.cross))


def checks(model: str, args: argparse.Namespace, scratch: Path) -> dict:
    """The stateful compile against the stateless graph, both with exact (unquantized)
    activations: quantized, a call's logits depend on how many tokens it feeds (~0.3), which
    would hide what the state does."""
    exact = Cases(REPO / "models" / model, args.threads, args.past, scratch, aq="off")
    return {"equivalence": exact.stateful_equivalence(), "two_rows": exact.stateful_two_rows()}


def measure(model: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        c = Cases(REPO / "models" / model, args.threads, args.past, Path(scratch))
        c.stateful_start([440] * args.past)
        kinds = {"numpy": c.numpy, "bound": c.bound, "stateful": c.stateful}
        samples: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for name in common.rotate(list(kinds), r):
                call = kinds[name]
                for _ in range(10):
                    call()
                started = time.perf_counter()
                for _ in range(args.steps):
                    call()
                samples[name].append((time.perf_counter() - started) / args.steps * 1e3)
        past_bytes = int(sum(b.nbytes for b in c.buffers))
        small = c.ids.nbytes + c.pos.nbytes + c.mask.nbytes
        return {
            "model": model,
            "ms": {k: statistics.median(v) for k, v in samples.items()},
            "spread": {k: (min(v), max(v)) for k, v in samples.items()},
            "handed": {
                "numpy": cross_bytes(c) + past_bytes + small,
                "bound": small,
                "stateful": cross_bytes(c) + small,
            },
            **checks(model, args, Path(scratch)),
        }


def main() -> None:
    args = parse_args()
    load = common.start_load(args)
    from app.runtime.sessions import cpu_has_native_bf16

    results = [] if args.skip_ways else [measure(m, args) for m in args.models.split(",")]
    aq_results = [measure_aq(m, args) for m in args.models.split(",")]
    precision = "bf16" if cpu_has_native_bf16() else "f32 (no native bf16 on this CPU)"
    lines = common.header(
        "Decoder state: handed over per call, bound once, or kept by the runtime",
        load,
        [
            f"One decoder step at one row, T = 1, past {args.past}, OpenVINO EP on CPU, "
            f"inference precision {precision}, activation quantization as the service's default "
            f"(auto), {args.threads} threads, int8 model files. "
            f"Median ms per call over {args.rounds} alternating rounds of {args.steps} calls "
            '(min–max of the round medians). "handed" = bytes of the inputs given to ONNX '
            "Runtime per call (for `bound`, the OrtValues bound once are not counted)."
        ],
    )
    rows = []
    for r in results:
        for kind in ("numpy", "bound", "stateful"):
            lo, hi = r["spread"][kind]
            rows.append(
                [
                    r["model"],
                    kind,
                    f"{r['ms'][kind]:.2f} ({lo:.2f}–{hi:.2f})",
                    f"{r['handed'][kind] / 1e6:.2f} MB",
                ]
            )
    lines += ["", *common.table(["model", "way", "ms per step", "handed per call"], rows)]
    lines += ["", "Stateful compile checks (activations not quantized on either side):", ""]
    for r in results:
        lines.append(
            f"- {r['model']}: logits vs the stateless graph over 2 windows × 12 greedy steps: "
            f"max abs difference {r['equivalence']:.1e}; 2 rows: {r['two_rows']}"
        )
    lines += [
        "",
        "## What the CPU computes with: activation quantization off / on",
        "",
        "The service's path (numpy inputs); ms per decoder call; rows × 1 token; `5 shared` = "
        "5 rows on one window (beams), `8 distinct` = 8 windows (batching). Tokens/s = rows / "
        "call time.",
        "",
    ]
    rows = []
    for r in aq_results:
        one = r["ms"][(1, False)]
        for (n, shared), ms in r["ms"].items():
            label = f"{n} {'shared' if shared else 'distinct'}"
            gains = " / ".join(
                f"{n / ms[aq] * one[aq]:.2f}×" for aq in ("off", "on")
            )  # tokens/s vs one row, same setting
            rows.append(
                [
                    r["model"],
                    label,
                    f"{ms['off']:.2f}",
                    f"{ms['on']:.2f}",
                    f"{ms['on'] / ms['off']:.2f}",
                    gains,
                ]
            )
    lines += common.table(
        ["model", "rows", "off ms", "on ms", "on ÷ off", "tokens/s vs 1 row (off / on)"], rows
    )
    lines += [""]
    for r in aq_results:
        inv = r["invariance"]
        lines.append(
            f"- {r['model']}: a row's logits alone vs in a call of 8: max abs difference "
            f"{inv['off']:.1e} (off), {inv['on']:.1e} (on)"
        )
    common.write(args.out_dir / "decoder_state.md", lines)


if __name__ == "__main__":
    main()
