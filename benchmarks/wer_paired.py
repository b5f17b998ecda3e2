"""Does a change of numerics change the words? Two versions of the code on the same corpus,
judged by their paired noise.

`transcribe` runs in the Python of one version (`--checkout`: its source tree, whose `app`
package wins; run it with that version's venv) and writes every clip's text, in process, with
the service's runtime settings (its defaults and STT_* variables; `--threads` 2) and the given
beam, language English.
`compare` scores two such files against the references (Whisper's English normaliser): corpus
WER of each, and the per-clip error differences with a sign-flip test — the differences' signs
flipped at random 20 000 times; a net change inside ±2 sd of those totals is noise.

The corpus: `benchmarks/data/devcorpus/` (162 LibriSpeech utterances, 18 speakers, ~3,800 words;
its README says where they come from).

    /tmp/oldvenv/bin/python -m benchmarks.wer_paired transcribe --checkout /tmp/old \\
        --model tiny.en --beam 5 --out /tmp/old-tiny-5.json
    .venv/bin/python -m benchmarks.wer_paired transcribe --model tiny.en --beam 5 \\
        --out /tmp/new-tiny-5.json
    .venv/bin/python -m benchmarks.wer_paired compare /tmp/old-tiny-5.json /tmp/new-tiny-5.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import REPO

CORPUS = REPO / "benchmarks" / "data" / "devcorpus"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("transcribe")
    t.add_argument("--checkout", type=Path, default=REPO, help="the version's source tree")
    t.add_argument("--model", default="tiny.en")
    t.add_argument("--models-dir", type=Path, default=REPO / "models")
    t.add_argument("--beam", type=int, default=1)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--corpus", type=Path, default=CORPUS)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument(
        "--system",
        default="ours",
        help="ours (the checkout, in process), or a peer configuration of benchmarks/common.py "
        "(fw-int8: faster-whisper int8 on the same weights, in its venv)",
    )
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--corpus", type=Path, default=CORPUS)
    return p.parse_args()


def entries(corpus: Path) -> list[dict]:
    with (corpus / "manifest.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def transcribe(args: argparse.Namespace) -> None:
    if args.system != "ours":
        return transcribe_peer(args)
    sys.path.insert(0, str(args.checkout.resolve()))
    from app.config import Settings
    from app.engine.audio import decode_audio
    from app.engine.tokenizer import Tokenizer
    from app.main import runtime_options
    from app.runtime.sessions import WhisperSessions
    from app.service.transcription.options import TranscriptionOptions
    from app.service.transcription.transcriber import Transcriber

    folder = args.models_dir / args.model
    sessions = WhisperSessions.load(folder, runtime_options(Settings(threads=args.threads)))
    transcriber = Transcriber(sessions, Tokenizer.from_folder(folder, sessions.manifest))
    options = TranscriptionOptions(language="en", beam_size=args.beam)
    texts, started = {}, time.perf_counter()
    for entry in entries(args.corpus):
        segments, _ = transcriber.transcribe(decode_audio(args.corpus / entry["file"]), options)
        texts[entry["file"]] = " ".join(s.text.strip() for s in segments)
    # an older checkout's sessions may not say their arithmetic
    arithmetic = getattr(sessions, "arithmetic", {}).get("encoder")
    meta = {"checkout": str(args.checkout), "cpu": arithmetic}
    save(args, texts, time.perf_counter() - started, meta)


def transcribe_peer(args: argparse.Namespace) -> None:
    """The corpus through a peer's warm worker (`benchmarks/common.py`), greedy or beam."""
    sys.path.insert(0, str(REPO))
    from benchmarks.common import CONFIGS, workers

    texts, started = {}, time.perf_counter()
    with workers(args.model, [CONFIGS[args.system]], args.threads) as running:
        (worker,) = running.values()
        for entry in entries(args.corpus):
            reply = worker.transcribe(args.corpus / entry["file"], args.beam, language="en")
            texts[entry["file"]] = reply["text"]
    save(args, texts, time.perf_counter() - started, {"system": args.system})


def save(args: argparse.Namespace, texts: dict[str, str], elapsed: float, meta: dict) -> None:
    meta = {**meta, "model": args.model, "beam": args.beam}
    args.out.write_text(json.dumps({**meta, "seconds": elapsed, "texts": texts}, indent=1))
    print(f"{len(texts)} clips in {elapsed:.1f} s -> {args.out}")


def clip_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word errors, reference words) of one clip after Whisper's English normaliser."""
    from benchmarks.common import wer

    _, errors, words = wer([reference], [hypothesis])
    return errors, words


def sign_flip(diffs: list[int], rounds: int = 20_000) -> tuple[float, float]:
    """(two-sided p of the total, sd of the totals) under random signs."""
    import numpy as np

    d = np.array(diffs, dtype=float)
    totals = np.random.default_rng(0).choice([-1.0, 1.0], size=(rounds, len(d))) @ d
    p = float(np.mean(np.abs(totals) >= abs(d.sum()) - 1e-9)) if d.any() else 1.0
    return p, float(totals.std())


def compare(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
    diffs, totals, words = [], [0, 0], 0
    for entry in entries(args.corpus):
        (e0, n), (e1, _) = (
            clip_errors(entry["text"], run["texts"][entry["file"]]) for run in (before, after)
        )
        diffs.append(e1 - e0)
        totals[0] += e0
        totals[1] += e1
        words += n
    p, sd = sign_flip(diffs)
    changed = sum(1 for d in diffs if d)
    print(
        f"{before['model']} beam {before['beam']}: WER {100 * totals[0] / words:.2f} % -> "
        f"{100 * totals[1] / words:.2f} % ({words} words); errors {totals[1] - totals[0]:+d} "
        f"over {changed} clips that changed; paired noise ±2 sd = ±{2 * sd:.1f} errors, p {p:.2f}"
    )


def main() -> None:
    args = parse_args()
    if args.command == "transcribe":
        transcribe(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
