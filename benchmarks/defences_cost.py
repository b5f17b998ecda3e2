"""What the default hallucination defences cost end to end: the 60 s clip through our worker with
the service's defaults (VAD filter on) and with the VAD filter off, alternating run by run.

The no-speech skip and the repetition guard cost nothing measurable (a comparison per window and
a loop check per step) and are on in both; the quiet-input lift runs in both. So the difference
is the VAD pass (Silero over the whole upload, `app.engine.vad_sequence`) against what it saves (the
non-speech it cuts need not be encoded or decoded).

    .venv/bin/python -m benchmarks.defences_cost [--models tiny.en,base] [--beams 1,5] [--runs 5]

Writes benchmarks/results/defences_cost.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import common
from benchmarks.common import CONFIGS, EARNINGS, Worker

SETTINGS = {"defaults (VAD on)": {"vad_filter": True}, "VAD off": {"vad_filter": False}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--config", default="ov-int8", help="our configuration (see common.CONFIGS)")
    common.add_args(p)
    args = p.parse_args()
    config = CONFIGS[args.config]
    for model in args.models.split(","):
        common.prepare_models(model, [config])
    load_before = common.start_load(args)
    rows = []
    for model in args.models.split(","):
        worker = Worker(model, config, args.threads)
        try:
            for beam in (int(b) for b in args.beams.split(",")):
                for options in SETTINGS.values():  # warm-up, not timed
                    worker.transcribe(EARNINGS, beam, **options)
                times: dict[str, list[float]] = {k: [] for k in SETTINGS}
                texts: dict[str, str] = {}
                for r in range(args.runs):
                    for name in common.rotate(list(SETTINGS), r):
                        reply = worker.transcribe(EARNINGS, beam, **SETTINGS[name])
                        times[name].append(reply["total_s"])
                        texts[name] = reply["text"]
                on, off = (statistics.median(times[k]) for k in SETTINGS)
                errors = {k: common.wer([common.clip_reference(EARNINGS)], [t])[0]
                          for k, t in texts.items()}  # fmt: skip
                rows.append([model, beam, f"{on:.3f}", f"{off:.3f}", f"{on / off:.3f}",
                             f"{errors['defaults (VAD on)']:.1f} / {errors['VAD off']:.1f}",
                             f"{common.load1():.2f}"])  # fmt: skip
                print(rows[-1], file=sys.stderr)
        finally:
            worker.close()
    lines = common.header(
        "Cost of the default defences on the 60 s clip (VAD on vs off)",
        load_before,
        [
            f"{config.label}, {args.runs} alternating runs after a warm-up, medians of the "
            "end-to-end time (decode the file + transcribe). Target: defaults <= 1.05 x.",
        ],
    )
    lines += ["", *common.table(
        ["model", "beam", "defaults s", "VAD off s", "ratio", "WER % on / off", "load"], rows
    )]  # fmt: skip
    common.write(args.out_dir / "defences_cost.md", lines)


if __name__ == "__main__":
    main()
