"""Accuracy: WER on the English testdata clips, ours vs faster-whisper with the same weights.

Every English clip of tests/data/manifest.jsonl with a reference text (jfk in its three
encodings, five LibriSpeech utterances, the 60 s earnings clip; the Spanish clip and the empty
clip are left out) is transcribed once per configuration and beam size (decoding is
deterministic at temperature 0; the fallback schedule is each system's default). WER is corpus
level (errors over all clips / reference words) after Whisper's English normaliser
(transformers' `EnglishTextNormalizer` with openai/whisper's spelling map; torch is not
imported). The empty clip's output is reported separately (it should be empty).

Configurations: ours on OpenVINO (int8, fp16 or fp32 files, with or without the bf16 hint)
and the CPU EP, faster-whisper int8 and float32; language fixed to English; beam 1 and 5.

    .venv/bin/python -m benchmarks.accuracy            # both models, ~8 min
    .venv/bin/python -m benchmarks.accuracy --quick    # tiny.en, OV int8 + bf16, fw int8/fp32

Writes benchmarks/results/accuracy.md (+ accuracy.json with every transcript).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import CONFIGS, Worker


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument(
        "--configs", default="ov-int8-bf16,ov-int8,ov-fp16-bf16,ov-fp32,cpu-int8,fw-int8,fw-fp32"
    )
    p.add_argument("--beams", default="1,5")
    p.add_argument("--quick", action="store_true")
    common.add_args(p)
    args = p.parse_args()
    if args.quick:
        args.models, args.configs = "tiny.en", "ov-int8-bf16,fw-int8,fw-fp32"
    return args


def word_diff(a: str, b: str) -> str:
    """The changed spans between two normalised texts: `[old → new]`, `[+added]`, `[-dropped]`."""
    import difflib

    x, y = a.split(), b.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_opcodes():
        if op == "replace":
            out.append(f"[{' '.join(x[i1:i2])} → {' '.join(y[j1:j2])}]")
        elif op == "delete":
            out.append(f"[-{' '.join(x[i1:i2])}]")
        elif op == "insert":
            out.append(f"[+{' '.join(y[j1:j2])}]")
    return " ".join(out)


def main() -> None:
    args = parse_args()
    models = args.models.split(",")
    configs = common.parse_configs(args.configs)
    beams = [int(b) for b in args.beams.split(",")]
    clips = common.english_clips()
    empty = common.empty_clip()
    common.normalize("warm up")  # fetch the spelling map before measuring anything
    for model in models:
        common.peer_model_dir(model)
        common.prepare_models(model, configs)
    load_before = common.start_load(args)
    started = time.time()

    results: list[dict] = []
    for model in models:
        for config in configs:
            worker = Worker(model, config, args.threads)
            try:
                for beam in beams:
                    texts = [
                        worker.transcribe(common.TESTDATA / c["file"], beam)["text"] for c in clips
                    ]
                    empty_text = worker.transcribe(common.TESTDATA / empty["file"], beam)["text"]
                    w, errors, words = common.wer([c["text"] for c in clips], texts)
                    per_clip = [
                        common.wer([c["text"]], [t])[1] for c, t in zip(clips, texts, strict=True)
                    ]
                    results.append(
                        {
                            "model": model,
                            "config": config.key,
                            "beam": beam,
                            "wer": w,
                            "errors": errors,
                            "words": words,
                            "per_clip": per_clip,
                            "texts": texts,
                            "empty": empty_text,
                        }
                    )
                    print(f"[{model}] {config.key} beam {beam}: WER {w:.2f} %", file=sys.stderr)
            finally:
                worker.close()

    lines = common.header(
        "Accuracy: WER on the English testdata clips (same weights)",
        load_before,
        [
            f"{len(clips)} clips, {results[0]['words'] if results else 0} reference words "
            f"({', '.join(Path(c['file']).name for c in clips)}). Corpus WER after Whisper's "
            "English normaliser. Language fixed to English, each system's default decoding "
            "otherwise. `Δ fw` = our WER − faster-whisper's (same model and beam; the target is "
            "|Δ| ≤ 0.3 points against each of int8 and float32).",
        ],
    )
    lines += ["", "## WER (%)", ""]
    rows = []
    for r in results:
        peers = {
            x["config"]: x["wer"]
            for x in results
            if x["model"] == r["model"] and x["beam"] == r["beam"] and x["config"].startswith("fw")
        }
        deltas = " / ".join(f"{r['wer'] - v:+.2f}" for k, v in sorted(peers.items()))
        rows.append(
            [
                r["model"],
                r["beam"],
                CONFIGS[r["config"]].label,
                f"{r['wer']:.2f}",
                f"{r['errors']}/{r['words']}",
                deltas if CONFIGS[r["config"]].kind == "ours" else "-",
            ]
        )
    peer_names = " / ".join(sorted(k for k in {r["config"] for r in results} if k.startswith("fw")))
    lines += common.table(
        ["model", "beam", "system", "WER %", "errors/words", f"Δ vs {peer_names or 'fw'}"], rows
    )
    lines += ["", "## Errors per clip", ""]
    names = [Path(c["file"]).name for c in clips]
    lines += common.table(
        ["model", "beam", "system", *names],
        [[r["model"], r["beam"], CONFIGS[r["config"]].label, *r["per_clip"]] for r in results],
    )
    lines += ["", f"## The empty clip ({Path(empty['file']).name}, no speech): output", ""]
    lines += common.table(
        ["model", "beam", "system", "text"],
        [[r["model"], r["beam"], CONFIGS[r["config"]].label, repr(r["empty"])] for r in results],
    )
    differ = []
    for r in results:
        if CONFIGS[r["config"]].kind != "ours":
            continue
        peer = next(
            (
                x
                for x in results
                if x["model"] == r["model"] and x["beam"] == r["beam"] and x["config"] == "fw-fp32"
            ),
            None,
        )
        if peer is None:
            continue
        for name, a, b in zip(names, r["texts"], peer["texts"], strict=True):
            if common.normalize(a) != common.normalize(b):
                diff = word_diff(common.normalize(b), common.normalize(a))
                differ.append([r["model"], r["beam"], CONFIGS[r["config"]].label, name, diff])
    lines += ["", "## Where our text differs from faster-whisper float32 (normalised)", ""]
    lines += (
        common.table(["model", "beam", "system", "clip", "faster-whisper → ours"], differ)
        if differ
        else ["None."]
    )
    lines += ["", f"Wall time: {(time.time() - started) / 60:.1f} min."]
    out = args.out_dir / ("accuracy_quick.md" if args.quick else "accuracy.md")
    common.write(out, lines)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
