"""Tuning the live commit policy offline: how long a word waits for its commit, in audio, and
what the streamed text costs in WER — compute time excluded, so the machine's load does not
matter.

Each English test clip (one copy of jfk) is fed to a `StreamingSession` in 100 ms pieces; every
due pass runs at once (as if decoding took no time). For every committed word, its lag is the
audio received when it was committed minus the word's end (the session's measured word times).
WER is against the clips' reference texts, next to the file transcription's (greedy) WER of
the same model: the live target is within +1.0 point of it.

    .venv/bin/python benchmarks/live_policy_tuning.py --models tiny.en,base \
        --out benchmarks/results/live_policy_tuning.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import MODELS_DIR, TESTDATA, english_clips, header, load1, table, wer  # noqa: E402

DEFAULT_GRID = (
    "local_agreement:0:1.0,local_agreement:0:0.5,"
    "alignatt:0.3:1.0,alignatt:0.5:1.0,alignatt:0.7:1.0,"
    "alignatt:0.3:0.5,alignatt:0.4:0.5,alignatt:0.5:0.5"
)


def stream_once(transcriber, options, vad, audio: np.ndarray) -> tuple[list[float], str, int]:
    """(lag of each committed word, the streamed text, passes) for one clip."""
    from app.service.live import CommittedText, StreamingSession

    lags: list[float] = []
    session: StreamingSession

    def on_event(event: object) -> None:
        if isinstance(event, CommittedText):
            lags.append(session.received_s - event.end)

    session = StreamingSession(transcriber, options, vad, on_event)
    for i in range(0, len(audio), 1600):
        session.append(audio[i : i + 1600])
        while session.advance():
            session.decode()
    session.flush()
    while session.advance():
        session.decode()
    return lags, session.text, session.stats().passes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--grid", default=DEFAULT_GRID, help="policy:edge_s:step_s,...")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from app.engine.audio import decode_audio
    from app.engine.tokenizer import Tokenizer
    from app.engine.vad import SileroVad
    from app.runtime.sessions import RuntimeOptions, WhisperSessions
    from app.service.live import StreamingOptions
    from app.service.options import TranscriptionOptions
    from app.service.transcriber import Transcriber

    load_before = load1()
    clips, seen = [], set()
    for entry in english_clips():
        if entry["text"] not in seen:
            seen.add(entry["text"])
            clips.append((decode_audio(TESTDATA / entry["file"]), entry["text"]))
    refs = [text for _, text in clips]
    vad = SileroVad.load(MODELS_DIR / "silero_vad.onnx")
    rows = []
    for model in args.models.split(","):
        folder = MODELS_DIR / model
        transcriber = Transcriber(
            WhisperSessions.load(folder, RuntimeOptions(device="CPU")),
            Tokenizer.from_folder(folder),
        )
        greedy = TranscriptionOptions(beam_size=1, language="en")
        file_texts = [
            " ".join(s.text for s in transcriber.transcribe(audio, greedy)[0]) for audio, _ in clips
        ]
        file_wer = wer(refs, file_texts)[0]
        rows.append((model, "file (greedy)", "", "", "", "", f"{file_wer:.2f}", ""))
        for spec in args.grid.split(","):
            policy, edge, step = spec.split(":")
            options = StreamingOptions(
                language="en", policy=policy, edge_s=float(edge), step_s=float(step),  # type: ignore[arg-type]
                word_timestamps=True,
            )  # fmt: skip
            lags: list[float] = []
            texts: list[str] = []
            passes = 0
            for audio, _ in clips:
                clip_lags, text, clip_passes = stream_once(transcriber, options, vad, audio)
                lags += clip_lags
                texts.append(text)
                passes += clip_passes
            live_wer = wer(refs, texts)[0]
            lag = np.array(lags)
            rows.append((
                model, policy, "" if policy == "local_agreement" else edge, step,
                f"{np.median(lag):.2f}", f"{np.percentile(lag, 90):.2f}", f"{live_wer:.2f}",
                f"{live_wer - file_wer:+.2f}", passes,
            ))  # fmt: skip
            print(rows[-1], flush=True)
    rows = [r if len(r) == 9 else (*r, "") for r in rows]
    head = ["model", "policy", "edge s", "step s", "lag median s", "lag p90 s", "WER %",
            "vs file", "passes"]  # fmt: skip
    lines = header("Live commit policy tuning (offline, compute excluded)", load_before)
    lines += ["", *table(head, rows)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
