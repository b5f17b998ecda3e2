"""Long-form WER on the 10 min clip, ours vs faster-whisper, over several sampling seeds.

The clip (`common.long_clip()`) holds a sentence said three times in a row; windows holding two or
three copies compress above 2.4, so both systems fall back to sampling there
(`results/long10m_wer.md`). What a fallback window comes out as is then a matter of the sampling
seed, for both systems, so one run per system says little: this runs each system with seeds
0..N-1 and reports every run, the median and the range.

Systems (same weights, 2 threads, English): ours with its defaults (VAD on) and with
`--no-vad-filter`; faster-whisper int8 with its defaults (no VAD) and with `vad_filter=True`.
Seeds reach ours through `TranscriptionOptions.seed`, faster-whisper through
`ctranslate2.set_random_seed`.

    .venv/bin/python -m benchmarks.long_wer --model base --beams 1 --seeds 5

Writes benchmarks/results/long_wer_<model>.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import common
from benchmarks.robustness import SYSTEMS

DEFAULT_SYSTEMS = "ours,ours -VAD,fw,fw +VAD"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="base")
    p.add_argument("--beams", default="1", help="beam sizes (default greedy)")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    p.add_argument("--systems", default=DEFAULT_SYSTEMS)
    common.add_args(p)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    systems = [SYSTEMS[k.strip()] for k in args.systems.split(",") if k.strip()]
    clip = common.long_clip()
    reference = clip.with_suffix(".txt").read_text()
    common.normalize("warm up")
    common.peer_model_dir(args.model)
    common.prepare_models(args.model, [s.config for s in systems])
    load_before = common.start_load(args)
    started = time.time()
    runs: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    configs = {s.config.key: s.config for s in systems}.values()
    with common.workers(args.model, configs, args.threads) as workers:
        for beam in (int(b) for b in args.beams.split(",")):
            for seed in range(args.seeds):
                for system in common.rotate(systems, seed):
                    reply = workers[system.config.key].transcribe(
                        clip, beam, seed=seed, **system.options
                    )
                    w, _, _ = common.wer([reference], [reply["text"]])
                    runs.setdefault((beam, system.key), []).append(
                        (w, reply["total_s"], common.load1())
                    )
                    print(f"beam {beam} seed {seed} {system.key}: {w:.2f} %", file=sys.stderr)
    rows = []
    for (beam, key), found in runs.items():
        wers = [w for w, _, _ in found]
        rows.append([
            str(beam), key, " ".join(f"{w:.2f}" for w in wers),
            f"**{statistics.median(wers):.2f}**", f"{min(wers):.2f}–{max(wers):.2f}",
            f"{statistics.median(t for _, t, _ in found):.0f}",
            f"{max(ld for _, _, ld in found):.1f}",
        ])  # fmt: skip
    lines = common.header(
        f"Long-form WER over sampling seeds ({args.model}, 10 min clip)",
        load_before,
        [
            f"Clip: `{clip.name}` ({common.clip_duration(clip):.0f} s, "
            f"{len(common.normalize(reference).split())} reference words). "
            f"Seeds 0..{args.seeds - 1}; systems rotate seed by seed. Systems: "
            + "; ".join(f"`{s.key}` = {s.config.key} {s.options}" for s in systems)
            + f". Wall time {time.time() - started:.0f} s.",
        ],
    )
    lines += ["", *common.table(
        ["beam", "system", "WER % per seed", "median", "range", "median s", "max load"], rows
    )]  # fmt: skip
    common.write(args.out_dir / f"long_wer_{args.model}.md", lines)


if __name__ == "__main__":
    main()
