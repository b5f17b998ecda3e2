"""Which words AlignAtt's second reading protects: every word held for a second reading (the
word before an unsettled one, `AlignAtt.reread_below`), with the probability the decoder read it
with and whether the next pass read it the same — offline, as `live_policy_tuning.py` streams.

The words are held always here (`reread_below` above 1), so every candidate is seen; a held
word the stream then committed without a pass reading it again (a pause, a flush) is not
counted. The distribution of the probabilities of the words read otherwise is what
`REREAD_BELOW` is chosen from.

    .venv/bin/python -m benchmarks.live_rereads --models tiny.en,base --devcorpus 0:45 \
        --repo-clips --out /tmp/rereads.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import MODELS_DIR
from benchmarks.live_policy_tuning import speech_clips, stream_once

ALWAYS = 1.01  # above any probability: every candidate is held


class HeldWords:
    """AlignAtt holding every word before an unsettled one, noting what the next pass read."""

    reads_attention = True

    def __init__(self, edge_s: float) -> None:
        from app.service.live.policy import AlignAtt

        self.policy = AlignAtt(edge_s, reread_below=ALWAYS)
        self.ahead = AlignAtt(edge_s, reread_below=0.0)
        self.held = None  # the word held by the last pass
        self.clip = 0
        self.seen: list[dict] = []

    def commit_count(self, new: Sequence, pending: Sequence, audio_end_s: float, before=None):
        from app.service.live.policy import read_alike

        if self.held is not None and pending and pending[0].key == self.held.key:
            self.seen.append({
                "clip": self.clip, "word": self.held.word, "p": self.held.probability,
                "same": read_alike(new, pending) > 0, "next": "".join(w.word for w in new[:2]),
            })  # fmt: skip
        self.held = None
        count = self.policy.commit_count(new, pending, audio_end_s, before)
        if self.ahead.commit_count(new, pending, audio_end_s, before) > count:
            self.held = new[count]
        return count


def main() -> None:
    from app.engine.tokenizer import Tokenizer
    from app.engine.vad import SileroVad
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions
    from app.service.live.options import StreamingOptions
    from app.service.transcription.transcriber import Transcriber

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--devcorpus", default="0:45", metavar="FIRST:LAST")
    parser.add_argument("--repo-clips", action="store_true", help="the repo's clips first")
    parser.add_argument("--edge", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="every held word (JSON)")
    args = parser.parse_args()
    first, last = (int(x) for x in args.devcorpus.split(":"))
    audio = [samples for samples, _ in speech_clips(slice(first, last), args.repo_clips)]
    vad = SileroVad.load(MODELS_DIR / "silero_vad.onnx")
    found = {}
    for model in args.models.split(","):
        folder = MODELS_DIR / model
        transcriber = Transcriber(
            WhisperSessions.load(folder, RuntimeOptions(device="CPU")),
            Tokenizer.from_folder(folder),
        )
        options = StreamingOptions(
            language="en", policy="alignatt", edge_s=args.edge, step_s=1.0, word_timestamps=True
        )
        held = HeldWords(args.edge)
        for n, samples in enumerate(audio):
            held.clip, held.held = n, None
            stream_once(transcriber, options, vad, samples, held)
        found[model] = held.seen
        otherwise = sorted(x["p"] for x in held.seen if not x["same"] and x["p"] is not None)
        print(f"{model}: {len(held.seen)} words held, {len(otherwise)} read otherwise next, "
              f"with p {', '.join(f'{p:.2f}' for p in otherwise)}")  # fmt: skip
        for threshold in (0.5, 0.8, 0.9, 0.95):
            kept = sum(1 for x in held.seen if x["p"] is None or x["p"] < threshold)
            print(f"  held below {threshold}: {kept} of {len(held.seen)}")
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
