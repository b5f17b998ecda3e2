"""What word timing costs the decoding step: a separate aligner graph vs an extra decoder output.

Word timing needs the alignment heads' cross-attention. Two ways to get it:
  separate   `aligner.onnx`, run once per window after decoding; `decoder.onnx` is untouched
             (what the service does);
  in-decoder the decoder graph with an extra output `alignment_weights` [B, A, T, 1500], which
             the plain path does not fetch (ONNX Runtime is asked only for logits and K/V).
This builds the in-decoder variant from the same weights in a temporary folder and times one
decoder step (T = 1, a past of 100 tokens) on the OpenVINO EP, for 1 row and for 5 beams over a
batch-1 cross K/V: plain decoder, in-decoder variant without fetching the weights, and with.
A second session of the plain decoder is the control: how far two sessions of the same graph
differ. Calls alternate case by case; medians of --steps calls.

    .venv/bin/python benchmarks/aligner_cost.py --models tiny.en,base

Writes benchmarks/results/aligner_cost.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402

PAST = 100


def build_variant(model: str, folder: Path) -> Path:
    """decoder.onnx + an `alignment_weights` output, from the weights the model was built from."""
    import onnx

    from app.export import whisper_graphs as wg
    from app.export.build import PRECISIONS
    from app.export.graph_builder import GraphBuilder
    from app.export.sources import fetch_catalog_model
    from app.runtime import contract
    from app.runtime.contract import Manifest

    manifest = Manifest.load(REPO / "models" / model)
    weights = fetch_catalog_model(manifest.source["catalog"], REPO / ".cache" / "weights")
    w = weights.load_weights()
    dims = w.dims()
    g = GraphBuilder("whisper_decoder_with_alignment", PRECISIONS[manifest.precision])
    input_ids = g.input("input_ids", np.int64, ["batch", "new"])
    position_ids = g.input("position_ids", np.int64, ["batch", "new"])
    attention_mask = g.input("attention_mask", np.int64, ["batch", "total"])
    past = {
        n: g.input(n, np.float32, ["batch", dims.n_heads, "past", dims.head_dim])
        for n in contract.past_names(dims.n_text_layer)
    }
    cross = wg._cross_inputs(g, dims, "cross_batch")
    x, embed = wg._embed(g, w, input_ids, position_ids)
    bias = wg._mask_bias(g, input_ids, attention_mask)
    x, heads = wg._decoder_layers(g, w, x, bias, cross, past, manifest.alignment_heads)
    g.output(wg._logits(g, x, embed, input_ids, dims), "logits", np.float32,
             ["batch", "new", dims.n_vocab])  # fmt: skip
    g.output(g.op("Concat", heads, axis=1), "alignment_weights", np.float32,
             ["batch", len(heads), "new", dims.n_audio_ctx])  # fmt: skip
    path = folder / f"{model}_decoder_with_alignment.onnx"
    onnx.save(g.model(), path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--steps", type=int, default=200)
    common.add_args(p)
    args = p.parse_args()

    from app.runtime import contract
    from app.runtime.contract import Manifest
    from app.runtime.sessions import create_session

    load_before = common.start_load(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            folder = REPO / "models" / model
            dims = Manifest.load(folder).dims
            sessions = {
                name: create_session(
                    path, "openvino", "CPU", args.threads, graph_inputs_feed_attention=True
                )
                for name, path in (
                    ("plain", folder / "decoder.onnx"),
                    ("control", folder / "decoder.onnx"),
                    ("variant", build_variant(model, Path(tmp))),
                )
            }
            plain_out = contract.decoder_output_names(dims.n_text_layer)
            rng = np.random.default_rng(0)
            cross = {
                n: rng.normal(size=(1, dims.n_heads, 1500, dims.head_dim)).astype(np.float32)
                for n in contract.encoder_output_names(dims.n_text_layer)
            }
            for rows_n in (1, 5):
                feed = {
                    "input_ids": np.full((rows_n, 1), 440, np.int64),
                    "position_ids": np.full((rows_n, 1), PAST, np.int64),
                    "attention_mask": np.ones((rows_n, PAST + 1), np.int64),
                    **{
                        n: rng.normal(size=(rows_n, dims.n_heads, PAST, dims.head_dim)).astype(
                            np.float32
                        )
                        for n in contract.past_names(dims.n_text_layer)
                    },
                    **cross,
                }
                cases = {
                    "plain decoder": (sessions["plain"], plain_out),
                    "plain decoder, a second session (control)": (sessions["control"], plain_out),
                    "with output, not fetched": (sessions["variant"], plain_out),
                    "with output, fetched": (
                        sessions["variant"],
                        [*plain_out, "alignment_weights"],
                    ),
                }
                times: dict[str, list[float]] = {k: [] for k in cases}
                for _ in range(10):
                    for session, outputs in cases.values():
                        session.run(outputs, feed)
                for _ in range(args.steps):
                    for key, (session, outputs) in cases.items():
                        t0 = time.perf_counter()
                        session.run(outputs, feed)
                        times[key].append(time.perf_counter() - t0)
                base = statistics.median(times["plain decoder"])
                for key, found in times.items():
                    median = statistics.median(found)
                    rows.append([model, str(rows_n), key, f"{1000 * median:.2f}",
                                 f"{median / base:.3f}"])  # fmt: skip
                    print(rows[-1], file=sys.stderr)
    lines = common.header(
        "Word timing's cost to the decoding step: separate aligner vs an extra decoder output",
        load_before,
        [
            f"One decoder step, past {PAST} tokens, OpenVINO EP CPU, {args.threads} threads, "
            f"median of {args.steps} calls per case, cases alternating."
        ],
    )
    lines += ["", *common.table(["model", "rows", "case", "ms / step", "÷ plain"], rows)]
    common.write(args.out_dir / "aligner_cost.md", lines)


if __name__ == "__main__":
    main()
