"""What speakers add to the end-to-end time of a transcription (issue 33: at most 25 %), with
the service's own runtime: the 60 s earnings clip transcribed plain, with word timing, and with
speakers (word timing + diarization), alternated, `--runs` times each; medians. Whisper runs on
the service's default execution provider and device (OpenVINO, AUTO), `--threads` threads, and
the speaker models where the service puts them (ONNX Runtime's CPU provider on a CPU),
`--speaker-threads` threads, diarizing beside the transcription as the service does.
`diarization.py` measures the same with every model on the CPU provider, beside DER.

    .venv/bin/python -m benchmarks.diarization_e2e --model base --runs 5

Writes benchmarks/results/diarization_e2e.md.
"""

from __future__ import annotations

import argparse

from app.engine.vad import SileroVad
from app.runtime.placement import RuntimeOptions
from app.service.diarize.job import SPEAKER_THREADS
from benchmarks.common import add_args, header, start_load, write
from benchmarks.diarization import MODELS, end_to_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="Whisper model (default base)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (median)")
    parser.add_argument(
        "--speaker-threads",
        type=int,
        default=SPEAKER_THREADS,
        help=f"threads of each speaker model (default {SPEAKER_THREADS}, the service's)",
    )
    add_args(parser)
    args = parser.parse_args()
    load_before = start_load(args)
    vad = SileroVad.load(MODELS / "silero_vad.onnx")
    runtime = RuntimeOptions(threads=args.threads)
    lines = end_to_end(args.model, runtime, vad, args.runs, args.speaker_threads)
    title = "Speakers in the end-to-end time of a transcription (the service's runtime)"
    write(args.out_dir / "diarization_e2e.md", [*header(title, load_before), "", *lines])


if __name__ == "__main__":
    main()
