"""Robustness: WER per real-world condition and words written over non-speech, ours vs
faster-whisper, on the corpus of `benchmarks/robustness_corpus.py` (built when missing).

Systems (same weights, 2 threads, language fixed to English):
  ours              the service's defaults: Silero VAD (level-normalised), no-speech window
                    skip, repetition guard, quiet input lifted for the model
  ours -VAD         the same without the VAD filter (what the VAD earns)
  ours -defences    no VAD, no no-speech skip, no repetition guard (what all of them earn)
  fw                faster-whisper int8 with its defaults (no VAD)
  fw +VAD           faster-whisper int8 with `vad_filter=True`
Each file is transcribed once per system and beam size (decoding is deterministic at
temperature 0), the systems' order rotating file by file; time is the sum of the end-to-end
times. Speech WER is corpus-level per condition (Whisper's English normaliser); non-speech
counts the words of each clip's text (the target is 0).

    .venv/bin/python -m benchmarks.robustness                       # tiny.en + base, greedy
    .venv/bin/python -m benchmarks.robustness --nonspeech-beams 1,5 --models tiny.en
    .venv/bin/python -m benchmarks.robustness --beams 5 --nonspeech-beams "" --systems ours,fw

Writes benchmarks/results/robustness.md, robustness.json (every transcript) and robustness.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import common
from benchmarks.common import CONFIGS, Config, Worker
from benchmarks.robustness_corpus import OUT as CORPUS
from benchmarks.robustness_corpus import build

DEFENCES_OFF = {"vad_filter": False, "no_speech_threshold": None, "repetition_guard": False}


@dataclass(frozen=True)
class System:
    key: str
    config: Config
    options: dict = field(default_factory=dict)


SYSTEMS = {
    s.key: s
    for s in (
        System("ours", CONFIGS["ov-int8"], {"vad_filter": True}),
        System("ours -VAD", CONFIGS["ov-int8"], {"vad_filter": False}),
        System("ours -defences", CONFIGS["ov-int8"], DEFENCES_OFF),
        System("fw", CONFIGS["fw-int8"], {"vad_filter": False}),
        System("fw +VAD", CONFIGS["fw-int8"], {"vad_filter": True}),
    )
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--beams", default="1", help="beam sizes for the speech files")
    p.add_argument("--nonspeech-beams", default="1,5", help="beam sizes for non-speech files")
    p.add_argument("--corpus", type=Path, default=CORPUS)
    common.add_args(p)
    return p.parse_args()


def words(text: str) -> int:
    return len(common.normalize(text).split())


def run(args: argparse.Namespace) -> tuple[list[dict], list[dict], float]:
    systems = [SYSTEMS[k.strip()] for k in args.systems.split(",") if k.strip()]
    entries = [json.loads(line) for line in build(args.corpus).read_text().splitlines()]
    models = args.models.split(",")
    common.normalize("warm up")  # fetch the spelling map before measuring anything
    for model in models:
        common.peer_model_dir(model)
        common.prepare_models(model, [s.config for s in systems])
    load_before = common.start_load(args)
    rows: list[dict] = []
    for model in models:
        workers = {c.key: Worker(model, c, args.threads) for c in {s.config for s in systems}}
        try:
            for i, entry in enumerate(entries):
                beams = args.beams if entry["kind"] == "speech" else args.nonspeech_beams
                for beam in (int(b) for b in beams.split(",") if b):  # "": none
                    for system in common.rotate(systems, i):
                        reply = workers[system.config.key].transcribe(
                            args.corpus / entry["file"], beam, **system.options
                        )
                        rows.append({"model": model, "system": system.key, "beam": beam,
                                     **entry, "hyp": reply["text"],
                                     "total_s": reply["total_s"]})  # fmt: skip
                print(f"[{model}] {i + 1}/{len(entries)} {entry['file']}", file=sys.stderr)
        finally:
            for worker in workers.values():
                worker.close()
    return rows, [s.__dict__ | {"config": s.config.key} for s in systems], load_before


def speech_table(rows: list[dict], systems: list[str]) -> tuple[list[str], dict]:
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "speech":
            cells[(r["model"], r["beam"], r["condition"], r["system"])].append(r)
    conditions = list(dict.fromkeys(r["condition"] for r in rows if r["kind"] == "speech"))
    keys = sorted({(m, b) for m, b, _, _ in cells})
    figures: dict = {}
    lines: list[str] = []
    for model, beam in keys:
        table = []
        for condition in conditions:
            row = [condition]
            for system in systems:
                group = cells.get((model, beam, condition, system), [])
                if not group:
                    row.append("")
                    continue
                w, _errors, _n = common.wer([g["text"] for g in group], [g["hyp"] for g in group])
                figures[(model, beam, condition, system)] = w
                row.append(f"{w:.1f}")
            table.append(row)
        lines += ["", f"### {model}, beam {beam}: WER % per condition", ""]
        lines += common.table(["condition", *systems], table)
    return lines, figures


def nonspeech_table(rows: list[dict], systems: list[str]) -> list[str]:
    cells: dict[tuple, str] = {}
    for r in rows:
        if r["kind"] == "nonspeech":
            cells[(r["model"], r["beam"], r["condition"], r["system"])] = r["hyp"]
    conditions = list(dict.fromkeys(r["condition"] for r in rows if r["kind"] == "nonspeech"))
    lines: list[str] = []
    for model, beam in sorted({(m, b) for m, b, _, _ in cells}):
        table = []
        for condition in conditions:
            table.append([condition] + [
                str(words(cells[(model, beam, condition, s)]))
                if (model, beam, condition, s) in cells else "" for s in systems
            ])  # fmt: skip
        totals = ["**all**"] + [
            str(sum(words(t) for (m, b, _, s2), t in cells.items()
                    if (m, b, s2) == (model, beam, s)))
            for s in systems
        ]  # fmt: skip
        lines += ["", f"### {model}, beam {beam}: words written over non-speech", ""]
        lines += common.table(["clip", *systems], [*table, totals])
    return lines


def time_table(rows: list[dict], systems: list[str]) -> list[str]:
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for system in systems:
            mine = [r for r in rows if r["model"] == model and r["system"] == system]
            speech = sum(r["total_s"] for r in mine if r["kind"] == "speech")
            other = sum(r["total_s"] for r in mine if r["kind"] == "nonspeech")
            table.append([model, system, f"{speech:.1f}", f"{other:.1f}"])
    return common.table(["model", "system", "speech files (s)", "non-speech files (s)"], table)


def plot(figures: dict, systems: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(m, b) for m, b, _, _ in figures})
    fig, axes = plt.subplots(len(keys), 1, figsize=(12, 4.5 * len(keys)), squeeze=False)
    for ax, (model, beam) in zip(axes[:, 0], keys, strict=True):
        conditions = list(dict.fromkeys(c for m, b, c, _ in figures if (m, b) == (model, beam)))
        width = 0.8 / len(systems)
        for k, system in enumerate(systems):
            ys = [figures.get((model, beam, c, system), 0.0) for c in conditions]
            ax.bar([i + k * width for i in range(len(conditions))], ys, width, label=system)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(conditions))])
        ax.set_xticklabels(conditions, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("WER %")
        ax.set_title(f"{model}, beam {beam}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    args = parse_args()
    started = time.time()
    rows, systems, load_before = run(args)
    names = [s["key"] for s in systems]
    speech_lines, figures = speech_table(rows, names)
    lines = common.header(
        "Robustness: real-world conditions and non-speech, ours vs faster-whisper (same weights)",
        load_before,
        [
            "Corpus: `benchmarks/robustness_corpus.py` (seeded; 7 English clips per speech "
            "condition, each with 3 noise draws at SNR 20 and 10 dB; 11 non-speech clips of "
            "8-20 s). Systems: "
            + "; ".join(f"`{s['key']}` = {s['config']} {s['options'] or ''}" for s in systems)
            + f". Wall time {time.time() - started:.0f} s.",
        ],
    )
    lines += ["", "## Speech", *speech_lines]
    lines += ["", "## Non-speech", *nonspeech_table(rows, names)]
    lines += ["", "## Time (sum of end-to-end seconds)", "", *time_table(rows, names)]
    lines += ["", "![WER per condition](robustness.png)"]
    plot(figures, names, args.out_dir / "robustness.png")
    (args.out_dir / "robustness.json").write_text(json.dumps(rows, indent=1) + "\n")
    common.write(args.out_dir / "robustness.md", lines)


if __name__ == "__main__":
    main()
