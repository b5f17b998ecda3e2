"""What Whisper's temperature fallback and the previous text as a prompt cost and buy on the 10 min
clip: one model in process (`benchmarks.our_worker`'s engine, the VAD on, greedy, seed 0), the
clip transcribed with the service's defaults, without the fallback (one greedy attempt a window),
without the prompt (`condition_on_previous_text` off), and without either.

    python -m benchmarks.long_options --model tiny.en

Prints each option set's wall time, WER against the clip's reference and windows decoded.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import common

OPTION_SETS = {
    "defaults": {},
    "no fallback": {"temperature": (0.0,)},
    "no prompt": {"condition_on_previous_text": False},
    "neither": {"temperature": (0.0,), "condition_on_previous_text": False},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--models-dir", default=str(common.REPO / "models"))
    args = p.parse_args()

    from app.engine.audio import decode_audio
    from app.runtime.blas import quiet_blas
    from app.runtime.memory import tune_malloc
    from app.service.transcription.transcriber import TranscriptionOptions
    from benchmarks.our_worker import Engine

    tune_malloc()
    quiet_blas()
    engine = Engine()
    engine.load(f"{args.models_dir}/{args.model}", "openvino", "auto", threads=2)
    transcriber = engine.transcriber
    assert transcriber is not None
    clip = common.long_clip()
    audio, reference = decode_audio(str(clip)), clip.with_suffix(".txt").read_text()
    print(common.machine_line())
    for name, changes in OPTION_SETS.items():
        started = time.perf_counter()
        options = TranscriptionOptions(
            language="en", beam_size=1, vad_filter=True, seed=0, **changes
        )
        segments, info = transcriber.transcribe(audio, options)
        text = " ".join(s.text for s in segments)
        seconds = time.perf_counter() - started
        wer = common.wer([reference], [text])[0]
        windows = info.stats.windows
        print(f"{args.model} {name:12s} {seconds:6.2f} s  WER {wer:.2f} %  windows {windows}")


if __name__ == "__main__":
    main()
