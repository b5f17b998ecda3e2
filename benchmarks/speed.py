"""Speed: end-to-end time, RTF and per-stage time, ours vs faster-whisper on the same weights.

For each model, every configuration runs in its own warm process (see benchmarks/common.py):
ours on the OpenVINO EP and the CPU EP with fp32 files, OpenVINO with the bf16 inference
precision hint, and fp16 model files; faster-whisper (CTranslate2, the catalog's model.bin) with
int8 and float32 compute. All with the same thread count (2). For each clip and beam size, one
warm-up transcription per configuration, then `--runs` rounds; in every round each configuration
transcribes once, in an order that rotates between rounds (alternating, so a change in the
machine's load hits every configuration alike). Figures are medians.

Decoding options are each system's defaults (timestamps, temperature fallback 0..1.0, condition
on previous text), language fixed to English, beam 1 (greedy) or 5. End-to-end = decoding the
file + transcription + consuming all segments (model load excluded).

Clips: jfk.wav (11 s), the 60 s earnings clip, and a ~10 min clip made by concatenating the
English testdata clips (built once into .cache/bench/long10m.wav). The long clip gets
`--long-runs` rounds (default 1) and no warm-up of its own (the processes are warm from the shorter
clips), and by default only `--long-configs`.

    .venv/bin/python -m benchmarks.speed            # default matrix, ~15-20 min on 2 idle cores
    .venv/bin/python -m benchmarks.speed --quick    # tiny.en, jfk + 60 s, main configs, 3 runs

Writes benchmarks/results/speed.md (speed_quick.md with --quick) and speed_<model>.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import CONFIGS, Worker

CLIP_PATHS = {"jfk": common.JFK, "earnings60": common.EARNINGS, "long10m": common.LONG}
ALL = "ov-int8-bf16,ov-int8,ov-fp16-bf16,ov-fp32,cpu-int8,fw-int8,fw-fp32"
LONG_DEFAULT = "ov-int8-bf16,ov-fp16-bf16,fw-int8"
QUICK = "ov-int8-bf16,ov-fp32,cpu-int8,fw-int8,fw-fp32"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=f"configurations: {', '.join(CONFIGS)}"
    )
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--clips", default="jfk,earnings60,long10m", help=f"of {','.join(CLIP_PATHS)}")
    p.add_argument("--configs", default=ALL, help="configurations for jfk and the 60 s clip")
    p.add_argument("--long-configs", default=LONG_DEFAULT, help="configurations for long10m")
    p.add_argument("--beams", default="1,5", help="beam sizes (1 = greedy)")
    p.add_argument("--runs", type=int, default=5, help="measured rounds per cell (default 5)")
    p.add_argument("--long-runs", type=int, default=1, help="rounds for long10m (default 1)")
    p.add_argument(
        "--quick", action="store_true", help=f"tiny.en; jfk, earnings60; {QUICK}; 3 runs"
    )
    p.add_argument("--json", type=Path, help="also dump every sample here")
    common.add_args(p)
    args = p.parse_args()
    if args.quick:
        args.models, args.clips, args.configs, args.runs = "tiny.en", "jfk,earnings60", QUICK, 3
    return args


def measure_model(model: str, args: argparse.Namespace, results: list[dict]) -> dict:
    clips = [c.strip() for c in args.clips.split(",") if c.strip()]
    configs = common.parse_configs(args.configs)
    long_configs = common.parse_configs(args.long_configs) if "long10m" in clips else []
    needed = list(dict.fromkeys([*configs, *long_configs]))
    beams = [int(b) for b in args.beams.split(",")]
    workers: dict[str, Worker] = {}
    extra: dict = {"load": {}, "stages": {}}
    try:
        for config in needed:
            print(f"[{model}] loading {config.label}", file=sys.stderr)
            workers[config.key] = Worker(model, config, args.threads)
            extra["load"][config.key] = workers[config.key].loaded
        for config in needed:
            if config.kind == "peer":
                extra["stages"][config.key] = workers[config.key].call(
                    "stages", path=str(common.EARNINGS)
                )
        for clip in clips:
            path = common.long_clip() if clip == "long10m" else CLIP_PATHS[clip]
            long = clip == "long10m"
            cell_configs = long_configs if long else configs
            runs = args.long_runs if long else args.runs
            for beam in beams:
                load = common.load1()
                if not long:
                    for config in cell_configs:  # warm-up
                        workers[config.key].transcribe(path, beam)
                samples: dict[str, list[dict]] = {c.key: [] for c in cell_configs}
                for r in range(runs):
                    order = common.rotate(cell_configs, r)
                    for config in order:
                        out = workers[config.key].transcribe(path, beam)
                        samples[config.key].append(out)
                        print(
                            f"[{model}] {clip} beam {beam} {config.key}: {out['total_s']:.2f} s",
                            file=sys.stderr,
                        )
                for config in cell_configs:
                    results.append(
                        {
                            "model": model,
                            "clip": clip,
                            "beam": beam,
                            "config": config.key,
                            "runs": runs,
                            "warmup": not long,
                            "load": load,
                            "samples": samples[config.key],
                        }
                    )
    finally:
        for w in workers.values():
            w.close()
    return extra


def med(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def smed(samples: list[dict], key: str) -> float:
    return statistics.median(s["stats"][key] for s in samples)


def report(
    results: list[dict], extras: dict[str, dict], args: argparse.Namespace, load_before: float
) -> list[str]:
    durations = {c: common.clip_duration(CLIP_PATHS[c]) for c in {r["clip"] for r in results}}
    refs = {c: common.clip_reference(CLIP_PATHS[c]) for c in durations}
    lines = common.header(
        "Speed: ours vs faster-whisper (same weights)",
        load_before,
        [
            f"Threads: {args.threads} for every system. Medians of {args.runs} alternating rounds "
            f"after one warm-up per configuration (long10m: {args.long_runs} round(s), no warm-up "
            "of its own, processes already warm). Model load time excluded. Language fixed to "
            "English; otherwise each system's default decoding (timestamps, temperature fallback, "
            "conditioning on previous text). `load` = 1-min load average when the cell started (it "
            "includes this benchmark's own 2 threads from the previous cell: ~1-2 when nothing "
            "else runs).",
            "RTF = end-to-end seconds / audio seconds. `÷ fw int8` = our time / faster-whisper "
            "int8's in the same cell (target ≤ 0.8 on the 60 s and 10 min clips). WER against "
            "the clip's reference (Whisper normaliser), a sanity check that no configuration "
            "drops text; the accuracy benchmark is benchmarks/accuracy.py.",
        ],
    )
    lines += ["", "## End to end", ""]
    rows = []
    for r in results:
        s = r["samples"]
        total = med(s, "total_s")
        peer = next(
            (
                x
                for x in results
                if x["model"] == r["model"]
                and x["clip"] == r["clip"]
                and x["beam"] == r["beam"]
                and x["config"] == "fw-int8"
            ),
            None,
        )
        ratio = f"{total / med(peer['samples'], 'total_s'):.2f}" if peer else "-"
        w = common.wer([refs[r["clip"]]], [s[-1]["text"]])[0] if refs[r["clip"]] else float("nan")
        times = [x["total_s"] for x in s]
        rows.append(
            [
                r["model"],
                f"{r['clip']} ({durations[r['clip']]:.0f} s)",
                r["beam"],
                CONFIGS[r["config"]].label,
                r["runs"],
                f"{total:.3f} ({min(times):.2f}–{max(times):.2f})",
                f"{total / durations[r['clip']]:.4f}",
                ratio,
                f"{w:.1f}",
                s[-1]["tokens"],
                f"{r['load']:.2f}",
            ]
        )
    lines += common.table(
        [
            "model",
            "clip",
            "beam",
            "system",
            "runs",
            "end-to-end s (min–max)",
            "RTF",
            "÷ fw int8",
            "WER %",
            "tokens",
            "load",
        ],
        rows,
    )

    lines += [
        "",
        "## Where our time goes (medians, ms)",
        "",
        "audio = decode + resample the file; encoder = all 30 s windows; prefill = the "
        "prompt/sot prefix in one decoder call per window; decoder = the step calls (all "
        "beams together); search = the loop's Python (filters, beam selection, cache "
        "copies); other = the rest (segmenting, text; median of per-run remainders, so "
        "columns need not add up to the total exactly). steps/s = loop steps per decoder "
        "second; tok/s = output tokens per end-to-end second; handed/call = input bytes given "
        "to the runtime per decoder step call (cross and past K/V included: a CPU reads them in "
        "place, a GPU or NPU would copy them).",
        "",
    ]
    rows = []
    for r in results:
        if CONFIGS[r["config"]].kind != "ours":
            continue
        s = r["samples"]
        total = med(s, "total_s")
        parts = {
            k: smed(s, k)
            for k in (
                "mel_s",
                "encoder_s",
                "prefill_s",
                "decoder_s",
                "search_s",
                "windows",
                "steps",
                "attempts",
                "handed_nbytes",
                "decoder_calls",
            )
        }
        audio = med(s, "audio_decode_s")
        stages = ("mel_s", "encoder_s", "prefill_s", "decoder_s", "search_s")
        other = statistics.median(
            x["total_s"] - x["audio_decode_s"] - sum(x["stats"][k] for k in stages) for x in s
        )
        rows.append(
            [
                r["model"],
                r["clip"],
                r["beam"],
                CONFIGS[r["config"]].label,
                f"{audio * 1e3:.0f}",
                f"{parts['mel_s'] * 1e3:.0f}",
                f"{parts['encoder_s'] * 1e3:.0f} ({parts['windows']:.0f} w, "
                f"{parts['encoder_s'] * 1e3 / max(parts['windows'], 1):.0f}/w)",
                f"{parts['prefill_s'] * 1e3:.0f}",
                f"{parts['decoder_s'] * 1e3:.0f} ({parts['steps']:.0f} steps, "
                f"{parts['decoder_s'] * 1e3 / max(parts['steps'], 1):.1f}/step)",
                f"{parts['search_s'] * 1e3:.0f}",
                f"{other * 1e3:.0f}",
                f"{parts['attempts']:.0f}",
                f"{parts['steps'] / parts['decoder_s']:.0f}" if parts["decoder_s"] else "-",
                f"{s[-1]['tokens'] / total:.0f}",
                f"{parts['handed_nbytes'] / max(parts['decoder_calls'], 1) / 1e6:.1f} MB",
                f"{total * 1e3:.0f}",
            ]
        )
    lines += common.table(
        [
            "model",
            "clip",
            "beam",
            "system",
            "audio",
            "mel",
            "encoder",
            "prefill",
            "decoder",
            "search",
            "other",
            "attempts",
            "steps/s",
            "tok/s",
            "handed/call",
            "total",
        ],
        rows,
    )

    lines += [
        "",
        "## faster-whisper's stages, timed apart (ms, medians of 3)",
        "",
        "decode audio (PyAV) and log-mel of the 60 s clip, and one 30 s encoder window, "
        "each timed on its own in the warm worker; the rest of its end-to-end time is "
        "decoding. Ours for comparison: the per-window encoder time above.",
        "",
    ]
    rows = []
    for model, extra in extras.items():
        for key, st in extra["stages"].items():
            rows.append(
                [
                    model,
                    CONFIGS[key].label,
                    f"{st['audio_decode_s'] * 1e3:.0f}",
                    f"{st['mel_s'] * 1e3:.0f}",
                    f"{st['encoder_window_s'] * 1e3:.0f}",
                ]
            )
    lines += common.table(
        ["model", "system", "audio (60 s)", "mel (60 s)", "encoder / window"], rows
    )

    lines += ["", "## Model load (s) and RSS after load (MB), from the warm workers", ""]
    rows = []
    for model, extra in extras.items():
        for key, info in extra["load"].items():
            rows.append(
                [
                    model,
                    CONFIGS[key].label,
                    f"{info['load_s']:.2f}",
                    f"{info['rss_mb']:.0f}",
                    f"{info['peak_rss_mb']:.0f}",
                ]
            )
    lines += common.table(["model", "system", "load s", "RSS MB", "peak RSS MB"], rows)
    return lines


def plot(results: list[dict], out_dir: Path, suffix: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == model]
        clips = list(dict.fromkeys(r["clip"] for r in rows))
        fig, axes = plt.subplots(1, len(clips), figsize=(5.5 * len(clips), 4.5), squeeze=False)
        for ax, clip in zip(axes[0], clips, strict=True):
            cell = [r for r in rows if r["clip"] == clip]
            beams = sorted({r["beam"] for r in cell})
            keys = list(dict.fromkeys(r["config"] for r in cell))
            width = 0.8 / len(keys)
            for i, key in enumerate(keys):
                values = []
                for beam in beams:
                    r = next((x for x in cell if x["config"] == key and x["beam"] == beam), None)
                    values.append(
                        med(r["samples"], "total_s") / med(r["samples"], "audio_s") if r else 0
                    )
                xs = [b + (i - (len(keys) - 1) / 2) * width for b in range(len(beams))]
                ax.bar(
                    xs,
                    values,
                    width,
                    label=CONFIGS[key].label,
                    color=f"C{list(CONFIGS).index(key)}",
                    hatch="//" if CONFIGS[key].kind == "peer" else None,
                )
            ax.set_xticks(range(len(beams)), [f"beam {b}" for b in beams])
            ax.set_title(f"{model}, {clip}")
            ax.set_ylabel("RTF (lower is faster)")
            ax.grid(axis="y", alpha=0.3)
        handles: dict = {}
        for ax in axes[0]:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, h)
        axes[0][0].legend(handles.values(), handles.keys(), fontsize=8)
        fig.tight_layout()
        path = out_dir / f"speed{suffix}_{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    args = parse_args()
    if "long10m" in args.clips:
        common.long_clip()
    for model in args.models.split(","):
        common.peer_model_dir(model)
        configs = common.parse_configs(args.configs + "," + args.long_configs)
        common.prepare_models(model, configs)
    load_before = common.start_load(args)
    started = time.time()
    results: list[dict] = []
    extras: dict[str, dict] = {}
    for model in args.models.split(","):
        extras[model] = measure_model(model, args, results)
    suffix = "_quick" if args.quick else ""
    lines = report(results, extras, args, load_before)
    lines += ["", f"Wall time of the whole run: {(time.time() - started) / 60:.1f} min."]
    for path in plot(results, args.out_dir, suffix):
        lines += ["", f"![{path.stem}]({path.name})"]
    common.write(args.out_dir / f"speed{suffix}.md", lines)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "extras": extras}, indent=1))


if __name__ == "__main__":
    main()
