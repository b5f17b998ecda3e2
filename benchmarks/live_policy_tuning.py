"""Tuning the live commit policy offline: how long a word waits for its commit, in audio, and
what the streamed text costs in WER — compute time excluded, so the machine's load does not
matter.

Each English test clip (one copy of jfk) is fed to a `StreamingSession` in 100 ms pieces; every
due pass runs at once (as if decoding took no time). For every committed word, its lag is the
audio received when it was committed minus the word's end (the session's measured word times).
WER is against the clips' reference texts, next to the file transcription's (greedy) WER of
the same model: the live target is within +1.0 point of it.

`--against-sure S` runs every AlignAtt row a second time with the unsure-word gate at `S`
(`AlignAtt.sure`; 0 = off) and reports the per-clip word-error differences, paired, with a
sign-flip test (p: how often random signs give a total at least as far from 0), per row and
pooled over the rows: a change smaller than its paired noise shows as a large p.

`--devcorpus N` adds the first N clips of `benchmarks/data/devcorpus` (more words). The grid's
policies `alignatt_one_pass` (AlignAtt without the second reading of the word before an
unsettled one, `AlignAtt.reread_below` 0), `alignatt_always_reread` (that word always read
twice, however sure: the rule before `REREAD_BELOW`) and `alignatt_first_alone` (the first
reading of new speech commits alone, `AlignAtt.first_alone`) measure what those rules cost.

`--clip-lags N` prints the median lag of each of the first N clips (the repo's clips come first).

`--texts FILE` writes every row's streamed texts (JSON, per clip), to compare two versions of the
code word for word.

    .venv/bin/python -m benchmarks.live_policy_tuning --models tiny.en,base \
        --out benchmarks/results/live_policy_tuning.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import wer_paired
from benchmarks.common import MODELS_DIR, TESTDATA, english_clips, header, load1, table, wer

VARIANTS = {  # AlignAtt with one of its rules measured off
    "alignatt_one_pass": {"reread_below": 0.0},
    "alignatt_always_reread": {"reread_below": 1.01},
    "alignatt_first_alone": {"first_alone": True},
}
DEFAULT_GRID = (
    "local_agreement:0:1.0,local_agreement:0:0.5,"
    "alignatt:0.3:1.0,alignatt:0.5:1.0,alignatt:0.7:1.0,"
    "alignatt:0.3:0.5,alignatt:0.4:0.5,alignatt:0.5:0.5"
)


def stream_once(
    transcriber, options, vad, audio: np.ndarray, policy=None
) -> tuple[list[float], str, int]:
    """(lag of each committed word, the streamed text, passes) for one clip; `policy` replaces
    the session's commit policy."""
    from app.service.live import CommittedText, StreamingSession

    lags: list[float] = []
    session: StreamingSession

    def on_event(event: object) -> None:
        if isinstance(event, CommittedText):
            lags.append(session.received_s - event.end)

    session = StreamingSession(transcriber, options, vad, on_event)
    if policy is not None:
        session.policy = policy
    for i in range(0, len(audio), 1600):
        session.append(audio[i : i + 1600])
        while session.advance():
            session.decode()
    session.flush()
    while session.advance():
        session.decode()
    return lags, session.text, session.stats().passes


def speech_clips(devcorpus: slice, repo: bool = True) -> list[tuple[np.ndarray, str]]:
    """(audio, reference) of the repo's English clips (one copy of each text; `repo`), then the
    devcorpus clips in `devcorpus`."""
    from app.engine.audio import decode_audio

    clips, seen = [], set()
    for entry in english_clips() if repo else []:
        if entry["text"] not in seen:
            seen.add(entry["text"])
            clips.append((decode_audio(TESTDATA / entry["file"]), entry["text"]))
    for entry in wer_paired.entries(wer_paired.CORPUS)[devcorpus]:
        clips.append((decode_audio(wer_paired.CORPUS / entry["file"]), entry["text"]))
    return clips


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--grid", default=DEFAULT_GRID, help="policy:edge_s:step_s,...")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--against-sure", type=float, default=None, metavar="S",
                        help="pair every AlignAtt row with a run at AlignAtt.sure = S")  # fmt: skip
    parser.add_argument("--texts", type=Path, default=None, help="write the streamed texts (JSON)")
    parser.add_argument("--devcorpus", type=int, default=0, metavar="N",
                        help="also the first N clips of benchmarks/data/devcorpus")  # fmt: skip
    parser.add_argument("--clip-lags", type=int, default=0, metavar="N",
                        help="print the median lag of each of the first N clips")  # fmt: skip
    args = parser.parse_args()

    from app.engine.tokenizer import Tokenizer
    from app.engine.vad import SileroVad
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions
    from app.service.live import StreamingOptions
    from app.service.live.policy import AlignAtt
    from app.service.transcription.options import TranscriptionOptions
    from app.service.transcription.transcriber import Transcriber

    load_before = load1()
    clips = speech_clips(slice(0, args.devcorpus))
    refs = [text for _, text in clips]
    vad = SileroVad.load(MODELS_DIR / "silero_vad.onnx")
    rows = []
    pooled: list[int] = []
    streamed: dict[str, list[str]] = {}
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
            variant = VARIANTS.get(policy)
            options = StreamingOptions(
                language="en", policy="alignatt" if variant else policy,  # type: ignore[arg-type]
                edge_s=float(edge), step_s=float(step), word_timestamps=True,
            )  # fmt: skip
            replaced = AlignAtt(float(edge), **variant) if variant else None
            lags: list[float] = []
            texts: list[str] = []
            passes = 0
            for n, (audio, _) in enumerate(clips):
                clip_lags, text, clip_passes = stream_once(
                    transcriber, options, vad, audio, replaced
                )
                if args.clip_lags and n < args.clip_lags:
                    print(f"  {model} {spec} clip {n}: median lag {np.median(clip_lags):.3f} s "
                          f"({len(clip_lags)} commits, {clip_passes} passes)")  # fmt: skip
                lags += clip_lags
                texts.append(text)
                passes += clip_passes
            streamed[f"{model} {spec}"] = texts
            live_wer = wer(refs, texts)[0]
            lag = np.array(lags)
            rows.append((
                model, policy, "" if policy == "local_agreement" else edge, step,
                f"{np.median(lag):.2f}", f"{np.percentile(lag, 90):.2f}", f"{live_wer:.2f}",
                f"{live_wer - file_wer:+.2f}", passes,
            ))  # fmt: skip
            print(rows[-1], flush=True)
            if args.against_sure is not None and policy == "alignatt":
                other = AlignAtt(float(edge), sure=args.against_sure)
                diffs = [
                    wer([ref], [text])[1]
                    - wer([ref], [stream_once(transcriber, options, vad, audio, other)[1]])[1]
                    for (audio, ref), text in zip(clips, texts, strict=True)
                ]
                pooled += diffs
                rows.append(paired_row(model, f"{edge}/{step}: vs sure={args.against_sure:g}",
                                       diffs))  # fmt: skip
                print(rows[-1], flush=True)
    if pooled:
        rows.append(paired_row("all", "pooled rows", pooled))
    rows = [r if len(r) == 9 else (*r, "") for r in rows]
    head = ["model", "policy", "edge s", "step s", "lag median s", "lag p90 s", "WER %",
            "vs file", "passes"]  # fmt: skip
    lines = header("Live commit policy tuning (offline, compute excluded)", load_before)
    lines += ["", *table(head, rows)]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    if args.texts:
        args.texts.write_text(json.dumps(streamed, indent=1) + "\n")
    return 0


def paired_row(model: str, label: str, diffs: list[int]) -> tuple[object, ...]:
    """A table row: the per-clip error differences (this row's - the other's), their total
    and the two-sided sign-flip p of that total."""
    d = np.array(diffs, dtype=float)
    flips = np.random.default_rng(0).choice([-1.0, 1.0], size=(20000, len(d)))
    p = float(np.mean(np.abs(flips @ d) >= abs(d.sum()) - 1e-9)) if d.any() else 1.0
    detail = " ".join(f"{x:+d}" for x in diffs)
    return (model, label, "", "", "", "", f"errors {int(d.sum()):+d} ({detail})", f"p {p:.2f}", "")


if __name__ == "__main__":
    sys.exit(main())
