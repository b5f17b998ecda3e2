"""Latency of live transcription over the WebSocket (`/v1/audio/stream`), at real-time pace.

For each model, a real uvicorn server is started and each clip is sent as 100 ms pcm_s16le frames,
each frame sent once its audio has "happened" (frame i leaves at t0 + (i + 1) * 0.1 s), as a
microphone would deliver it. Measured:

- first partial: wall time of the first non-empty `transcript.text.partial` minus the time the
  first word began (t0 + its start in the audio);
- commit latency of a word: wall time of the `transcript.text.delta` that commits it minus the
  time the word ended (t0 + its end in the audio); median, p90 and max over all words;
- done after end: time from the last audio frame to `transcript.text.done` (session.close);
- WER of the streamed text against the REST transcription of the same clip (normalised words).

Word times are not the server's own estimates: they come from a forced alignment of the REST
transcript (beam 1) done here, with the PyTorch reference model of `tests/oracle.py` (the same
weights) and openai/whisper's method (cross-attention of the alignment heads, median filter,
DTW). Streamed words are matched to reference words with difflib; unmatched words are left out.

    .venv/bin/python benchmarks/stream_latency.py --models tiny.en,base \
        --out benchmarks/results/stream_latency.md
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
AUDIO = (REPO / ".." / "shared" / "testdata" / "audio").resolve()
CLIPS = {
    "jfk": AUDIO / "jfk.wav",
    "earnings60": AUDIO / "earnings22_1_4482311_3_62.wav",
}
SR = 16000
FRAME_S = 0.1
TOKENS_PER_SECOND = 50  # encoder positions per second

from benchmarks.api_latency import launch_server  # noqa: E402


# ---- reference word times -----------------------------------------------------------------------
def load_audio(path: Path) -> np.ndarray:
    from app.engine.audio import decode_audio

    return decode_audio(path)


def norm_word(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


@dataclass(frozen=True)
class RefWord:
    word: str
    start: float
    end: float


def _dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai/whisper's DTW (timing.py) on a [N, M] cost matrix -> (text idx, time idx)."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    trace = -np.ones((n + 1, m + 1))
    acc[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            acc[i, j] = cost[i - 1, j - 1] + c
            trace[i, j] = t
    i, j = n, m
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    arr = np.array(path[::-1])
    return arr[:, 0], arr[:, 1]


def reference_words(model_name: str, audio: np.ndarray, segments: list[dict]) -> list[RefWord]:
    """Word times of the REST segments by forced alignment (per 30 s window, as whisper)."""
    import torch
    from scipy.ndimage import median_filter

    from app.engine.tokenizer import Tokenizer
    from app.runtime.contract import Manifest
    from tests.oracle import reference_features, reference_for

    folder = REPO / "models" / model_name
    manifest = Manifest.load(folder)
    tok = Tokenizer.from_folder(folder, manifest)
    model = reference_for(folder)
    heads = [tuple(h) for h in manifest.alignment_heads]
    sot = list(tok.sot_sequence("en" if tok.multilingual else None, "transcribe"))
    windows: dict[int, list[int]] = {}
    for seg in segments:
        windows.setdefault(seg["seek"], []).extend(t for t in seg["tokens"] if t < tok.eot)
    words: list[RefWord] = []
    for seek, text_tokens in sorted(windows.items()):
        if not text_tokens:
            continue
        offset = seek * 160
        chunk = audio[offset : offset + 30 * SR]
        num_frames = min(3000, len(chunk) // 160)
        features = reference_features(chunk)  # [1, 80, 3000]
        tokens = [*sot, tok.no_timestamps, *text_tokens, tok.eot]
        with torch.no_grad():
            out = model(
                input_features=torch.from_numpy(features),
                decoder_input_ids=torch.tensor([tokens]),
                output_attentions=True,
            )
        att = torch.stack([out.cross_attentions[layer][0, head] for layer, head in heads])
        att = att[:, :, : num_frames // 2].numpy().astype(np.float64)  # [heads, T, frames/2]
        att = att / att.sum(axis=-1, keepdims=True)
        att = (att - att.mean(axis=-2, keepdims=True)) / (att.std(axis=-2, keepdims=True) + 1e-9)
        att = median_filter(att, size=(1, 1, 7), mode="reflect")
        matrix = att.mean(axis=0)[len(sot) : -1]  # rows: notimestamps + text tokens
        text_idx, time_idx = _dtw(-matrix)
        jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
        jump_times = time_idx[jumps] / TOKENS_PER_SECOND
        groups: list[list[int]] = []
        for t in text_tokens:
            piece = tok.decode([t])
            if not groups or piece.startswith(" "):
                groups.append([t])
            else:
                groups[-1].append(t)
        bounds = np.cumsum([0] + [len(g) for g in groups])
        for g, a, b in zip(groups, bounds[:-1], bounds[1:], strict=True):
            text = tok.decode(g).strip()
            if not norm_word(text):
                continue
            start = offset / SR + float(jump_times[min(a, len(jump_times) - 1)])
            end = offset / SR + float(jump_times[min(b, len(jump_times) - 1)])
            words.append(RefWord(text, start, end))
    return words


# ---- streaming ----------------------------------------------------------------------------------
@dataclass
class Run:
    t0: float = 0.0
    audio_end_t: float = 0.0
    events: list[tuple[float, dict]] = field(default_factory=list)


async def stream_clip(url: str, pcm: bytes) -> Run:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    run = Run()
    ws_url = url.replace("http://", "ws://") + "/v1/audio/stream"
    async with connect(ws_url, max_size=None) as ws:

        async def receive() -> None:
            try:
                async for message in ws:
                    run.events.append((time.monotonic(), json.loads(message)))
            except ConnectionClosed:
                pass

        receiver = asyncio.create_task(receive())
        step = int(FRAME_S * SR) * 2
        run.t0 = time.monotonic()
        for i, off in enumerate(range(0, len(pcm), step)):
            delay = run.t0 + (i + 1) * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await ws.send(pcm[off : off + step])
        run.audio_end_t = time.monotonic()
        await ws.send(json.dumps({"type": "session.close"}))
        await asyncio.wait_for(receiver, 600)
    return run


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def analyse(run: Run, ref: list[RefWord], rest_text: str) -> dict:
    import jiwer

    # committed words with the wall time of the delta that committed them
    committed: list[tuple[str, float]] = []
    for t, e in run.events:
        if e["type"] == "transcript.text.delta":
            committed.extend((w, t) for w in e["delta"].split() if norm_word(w))
    done = [t for t, e in run.events if e["type"] == "transcript.text.done"]
    partials = [
        t for t, e in run.events if e["type"] == "transcript.text.partial" and e["text"].strip()
    ]
    text = next((e["text"] for _, e in run.events if e["type"] == "transcript.text.done"), "")
    errors = [e for _, e in run.events if e["type"] == "error"]
    matcher = difflib.SequenceMatcher(
        None, [norm_word(w) for w, _ in committed], [norm_word(r.word) for r in ref],
        autojunk=False,
    )  # fmt: skip
    latencies = []
    slowest = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            _, t = committed[block.a + k]
            word = ref[block.b + k]
            latencies.append(t - (run.t0 + word.end))
            slowest.append((round(latencies[-1], 2), word.word, round(word.end, 2)))
    first_word = ref[0].start if ref else 0.0
    norm = lambda s: " ".join("".join(c.lower() if c.isalnum() else " " for c in s).split())  # noqa: E731
    return {
        "first_partial_s": (partials[0] - (run.t0 + first_word)) if partials else float("nan"),
        "first_commit_s": (
            (min(t for _, t in committed) - (run.t0 + first_word)) if committed else float("nan")
        ),
        "median_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "max_s": max(latencies) if latencies else float("nan"),
        "matched": len(latencies),
        "words": len(committed),
        "ref_words": len(ref),
        "done_after_end_s": (done[0] - run.audio_end_t) if done else float("nan"),
        "wer_vs_rest": jiwer.wer(norm(rest_text), norm(text)) if text else 1.0,
        "errors": len(errors),
        "slowest": sorted(slowest, reverse=True)[:6],
        "text": text,
    }


def rest_verbose(url: str, path: Path, model: str) -> dict:
    with path.open("rb") as f:
        r = httpx.post(
            url + "/v1/audio/transcriptions",
            files={"file": (path.name, f)},
            data={"model": model, "response_format": "verbose_json", "beam_size": "1",
                  "language": "en"},
            timeout=600,
        )  # fmt: skip
    r.raise_for_status()
    return r.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default="tiny.en,base", help="comma list (default: %(default)s)"
    )
    parser.add_argument("--clips", default="jfk,earnings60", help=f"of {', '.join(CLIPS)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs per clip (default 1)")
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--env", action="append", default=[], metavar="STT_X=V",
                        help="extra server setting, e.g. --env STT_STREAM_STEP_S=0.5")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    parser.add_argument("--append", action="store_true", help="add a section to --out")
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)

    rows = []
    for model in args.models.split(","):
        server = launch_server(model, args.models_dir, extra_env)
        try:
            for clip in args.clips.split(","):
                path = CLIPS[clip]
                audio = load_audio(path)
                pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
                rest = rest_verbose(server.url, path, model)
                ref = reference_words(model, audio, rest["segments"])
                for rep in range(args.repeats):
                    run = asyncio.run(stream_clip(server.url, pcm))
                    row = {"model": model, "clip": clip, "run": rep + 1,
                           **analyse(run, ref, rest["text"])}  # fmt: skip
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "text"}), flush=True)
                    print("   ", row["text"], flush=True)
        finally:
            server.stop()

    header = (
        "| model | clip | run | first partial | first commit | commit latency median / p90 / max "
        "| words matched | done after end | WER vs REST |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['clip']} | {r['run']} | {r['first_partial_s']:.2f} s "
            f"| {r['first_commit_s']:.2f} s "
            f"| {r['median_s']:.2f} / {r['p90_s']:.2f} / {r['max_s']:.2f} s "
            f"| {r['matched']}/{r['ref_words']} | {r['done_after_end_s']:.2f} s "
            f"| {100 * r['wer_vs_rest']:.1f} % |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = ", ".join(args.env) or "defaults"
        section = (
            f"## Server settings: {settings}\n\n"
            f"`{' '.join(['benchmarks/stream_latency.py', *sys.argv[1:]])}` on "
            f"{platform.node()} ({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}, "
            f"load average at the end {os.getloadavg()[0]:.1f}.\n\n" + table + "\n"
        )
        if args.append and args.out.exists():
            args.out.write_text(args.out.read_text() + "\n" + section)
        else:
            args.out.write_text(
                "# Live stream latency (WebSocket, real-time pace)\n\n"
                "Commit latency = wall time of the delta that commits a word - the time the word "
                "ended (forced alignment of the REST transcript); first partial = first "
                "non-empty partial - start of the first word; done after end = last audio "
                "frame -> transcript.text.done. 100 ms frames sent at real-time pace.\n\n" + section
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
