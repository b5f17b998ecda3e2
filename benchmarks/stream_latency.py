"""Latency of live transcription over the OpenAI Realtime protocol (`/v1/realtime`), at
real-time pace, with the commit policies side by side and several streams at once.

For each model one real uvicorn server is started per policy (`STT_STREAM_POLICY`), or per
`--variant` (a label and server settings: policies are variants too); each run
sends a clip as 24 kHz `audio/pcm` in 100 ms `input_audio_buffer.append` events, each once its
audio has "happened" (frame i leaves at t0 + (i + 1) * 0.1 s), as a microphone would deliver it,
with the server's default turn detection (server VAD); after the audio, one
`input_audio_buffer.commit`. Runs alternate between the variants (same clip, same repeat), so
load from other processes hits both alike. `--streams N` runs N sessions of the clip at once
(started 0.37 s apart), all measured. Measured per run:

- first delta: wall time of the first `...transcription.delta` minus the time the first word
  began (t0 + its start in the audio);
- commit latency of a word: wall time of the delta that carries it minus the time the word ended
  (t0 + its end in the audio); median, p90 and max over all words (of all streams);
- done after end: from the last audio frame to the last `...transcription.completed`;
- WER of the streamed text (the items' transcripts in order) against the REST transcription of
  the same clip (greedy, normalised words); and both texts' WER against the clip's reference
  (`tests/data/manifest.jsonl`, Whisper's English normaliser).

Word times are not the server's own estimates: they come from a forced alignment of the REST
transcript done here with the PyTorch reference model of `tests/oracle.py` (the same weights)
and openai/whisper's method (cross-attention of the alignment heads, median filter, DTW).
Streamed words are matched to reference words with difflib; unmatched words are left out.

    .venv/bin/python -m benchmarks.stream_latency --models tiny.en,base \
        --policies local_agreement,alignatt --repeats 2 --out benchmarks/results/live_latency.md
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import difflib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import AUDIO, REPO, clip_reference, header, load1, wer
from benchmarks.server import VARIANT_HELP, launch_server, parse_variant

CLIPS = {
    "jfk": AUDIO / "jfk.wav",
    "earnings60": AUDIO / "earnings22_1_4482311_3_62.wav",
    "ls0": AUDIO / "1089-134686-0000.flac",
}
SR = 16000
WIRE_RATE = 24000
FRAME_S = 0.1
TOKENS_PER_SECOND = 50  # encoder positions per second
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


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


def _alignment_groups(segments: list[dict], longest_s: float = 28.0) -> list[tuple[float, list]]:
    """(where the audio to align starts, s; the text tokens) for runs of consecutive segments
    that span at most `longest_s` of the clip. Not by the segments' `seek`: with the server's
    VAD a window's speech spans more than 30 s of the clip once its silences are cut out."""
    groups: list[tuple[float, list]] = []
    first = 0.0
    for seg in segments:
        if not groups or seg["end"] - first > longest_s:
            first = seg["start"]
            groups.append((max(first - 0.2, 0.0), []))
        groups[-1][1].extend(seg["tokens"])
    return groups


def reference_words(model_name: str, audio: np.ndarray, segments: list[dict]) -> list[RefWord]:
    """Word times of the REST segments by forced alignment (<= 28 s of audio at a time)."""
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
    words: list[RefWord] = []
    for start_s, tokens_of_group in _alignment_groups(segments):
        text_tokens = [t for t in tokens_of_group if t < tok.eot]
        if not text_tokens:
            continue
        offset = round(start_s * 100) * 160
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


async def stream_clip(url: str, pcm24: bytes, delay_s: float = 0.0) -> Run:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay_s)
    run = Run()
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with connect(ws_url, max_size=None) as ws:
        items_done = asyncio.Event()

        async def receive() -> None:
            """Done when every committed item is completed, the item of the client's last
            commit among them: the one committed without a `speech_stopped` (the VAD's turns
            have one), or the commit answered as empty. Until then a server behind the client
            may still complete earlier turns."""
            committed: set[str] = set()
            completed: set[str] = set()
            stopped: set[str] = set()
            answered = False  # the client's commit has its item (or was empty)
            async for message in ws:
                event = json.loads(message)
                run.events.append((time.monotonic(), event))
                if event["type"] == "input_audio_buffer.speech_stopped":
                    stopped.add(event["item_id"])
                elif event["type"] == "input_audio_buffer.committed":
                    committed.add(event["item_id"])
                    answered = answered or event["item_id"] not in stopped
                elif event["type"] == COMPLETED:
                    completed.add(event["item_id"])
                elif event["type"] == "error":
                    empty = event["error"].get("code") == "input_audio_buffer_commit_empty"
                    answered = answered or empty
                    if not empty:
                        print("error event:", event["error"], file=sys.stderr)
                if answered and committed <= completed:
                    items_done.set()

        receiver = asyncio.create_task(receive())
        step = int(FRAME_S * WIRE_RATE) * 2
        run.t0 = time.monotonic()
        for i, off in enumerate(range(0, len(pcm24), step)):
            delay = run.t0 + (i + 1) * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            audio = base64.b64encode(pcm24[off : off + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        run.audio_end_t = time.monotonic()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await asyncio.wait_for(items_done.wait(), 600)
        receiver.cancel()
    return run


async def stream_many(url: str, pcm24: bytes, streams: int) -> list[Run]:
    return list(await asyncio.gather(*(stream_clip(url, pcm24, 0.37 * k) for k in range(streams))))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def norm(text: str) -> str:
    return " ".join("".join(c.lower() if c.isalnum() else " " for c in text).split())


def analyse(runs: list[Run], ref: list[RefWord], rest_text: str, truth: str) -> dict:
    import jiwer

    latencies: list[float] = []
    detail: list[dict] = []  # per matched word: its reference end and latency
    first_deltas, done_after, wers, texts = [], [], [], []
    matched = words = 0
    for run in runs:
        committed: list[tuple[str, float]] = []  # words with the wall time of their delta
        for t, e in run.events:
            if e["type"] == DELTA:
                committed.extend((w, t) for w in e["delta"].split() if norm_word(w))
        completed = [(t, e) for t, e in run.events if e["type"] == COMPLETED]
        text = " ".join(e["transcript"] for _, e in completed)
        matcher = difflib.SequenceMatcher(
            None, [norm_word(w) for w, _ in committed], [norm_word(r.word) for r in ref],
            autojunk=False,
        )  # fmt: skip
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                _, t = committed[block.a + k]
                word = ref[block.b + k]
                latencies.append(t - (run.t0 + word.end))
                detail.append({"word": word.word, "end_s": round(word.end, 2),
                               "latency_s": round(latencies[-1], 3)})  # fmt: skip
                matched += 1
        words += len(committed)
        first_word = ref[0].start if ref else 0.0
        if committed:
            first_deltas.append(min(t for _, t in committed) - (run.t0 + first_word))
        if completed:
            done_after.append(completed[-1][0] - run.audio_end_t)
        wers.append(jiwer.wer(norm(rest_text), norm(text)) if text else 1.0)
        texts.append(text)
    return {
        "first_delta_s": percentile(first_deltas, 50),
        "median_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "max_s": max(latencies) if latencies else float("nan"),
        "matched": matched,
        "ref_words": len(ref) * len(runs),
        "done_after_end_s": percentile(done_after, 50),
        "wer_vs_rest": float(np.mean(wers)),
        "wer": wer([truth] * len(texts), texts)[0],  # against the clip's reference text, %
        "rest_wer": wer([truth], [rest_text])[0],
        "load": load1(),
        "words": detail,
        "texts": texts,
    }


def report(row: dict, words: bool) -> None:
    """Print a run's figures (and, with `words`, its text and each word's latency)."""
    print(json.dumps({k: v for k, v in row.items() if k not in ("words", "texts")}), flush=True)
    if words:
        print("  text:", *row["texts"], sep="\n  ")
        for w in row["words"]:
            print(f"  {w['end_s']:7.2f} {w['latency_s']:6.2f} {w['word']}")


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
    parser.add_argument(
        "--policies",
        default="local_agreement,alignatt",
        help="STT_STREAM_POLICY values, run side by side (default: %(default)s)",
    )
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:STT_X=V,...",
                        help="compare servers with these settings instead of --policies: "
                        + VARIANT_HELP)  # fmt: skip
    parser.add_argument("--streams", default="1", help="comma list of concurrent streams")
    parser.add_argument("--repeats", type=int, default=2, help="runs per clip (default 2)")
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--env", action="append", default=[], metavar="STT_X=V",
                        help="extra server setting, e.g. --env STT_STREAM_STEP_S=0.5")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    parser.add_argument("--append", action="store_true", help="add a section to --out")
    parser.add_argument("--words", action="store_true", help="print each word's latency")
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)
    variants = [
        parse_variant(spec)
        for spec in args.variant or [f"{p}:STT_STREAM_POLICY={p}" for p in args.policies.split(",")]
    ]
    policies = [v.label for v in variants]
    load_before = load1()

    rows = []
    for model in args.models.split(","):
        servers = {
            v.label: launch_server(
                model, v.models_dir or args.models_dir, {**extra_env, **v.settings}, v.checkout
            )
            for v in variants
        }
        try:
            for clip in args.clips.split(","):
                path = CLIPS[clip]
                audio = load_audio(path)
                wire = soxr_resample(audio, SR, WIRE_RATE)
                pcm24 = (np.clip(wire, -1, 1) * 32767).astype("<i2").tobytes()
                rest = rest_verbose(servers[policies[0]].url, path, model)
                truth = clip_reference(path) or ""
                ref = reference_words(model, audio, rest["segments"])
                for streams in (int(n) for n in args.streams.split(",")):
                    for rep in range(args.repeats):
                        order = policies if rep % 2 == 0 else policies[::-1]
                        for policy in order:
                            runs = asyncio.run(stream_many(servers[policy].url, pcm24, streams))
                            row = {"model": model, "clip": clip, "policy": policy,
                                   "streams": streams, "run": rep + 1,
                                   **analyse(runs, ref, rest["text"], truth)}  # fmt: skip
                            rows.append(row)
                            report(row, args.words)
        finally:
            for server in servers.values():
                server.stop()

    lines = [
        "| model | clip | variant | streams | run | first delta | commit latency median / p90 / "
        "max | words matched | done after end | WER vs REST | WER stream / REST | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['clip']} | {r['policy']} | {r['streams']} | {r['run']} "
            f"| {r['first_delta_s']:.2f} s "
            f"| {r['median_s']:.2f} / {r['p90_s']:.2f} / {r['max_s']:.2f} s "
            f"| {r['matched']}/{r['ref_words']} | {r['done_after_end_s']:.2f} s "
            f"| {100 * r['wer_vs_rest']:.1f} % | {r['wer']:.1f} / {r['rest_wer']:.1f} % "
            f"| {r['load']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = ", ".join(args.env) or "defaults"
        title = f"Live latency (Realtime protocol, real-time pace), settings: {settings}"
        section = "\n".join(header(title, load_before))
        section = section.replace("# Live", "## Live", 1) + "\n\n" + table + "\n"
        if args.append and args.out.exists():
            args.out.write_text(args.out.read_text() + "\n" + section)
        else:
            args.out.write_text(
                "# Live latency\n\n"
                "Commit latency = wall time of the delta that carries a word - the time the word "
                "ended (forced alignment of the REST transcript); first delta = first delta - "
                "start of the first word; done after end = last audio frame -> last completed. "
                "24 kHz audio/pcm in 100 ms appends at real-time pace, server VAD turns; "
                "'load' is the 1-min load average after the run.\n\n" + section
            )
    return 0


def soxr_resample(audio: np.ndarray, src: int, dst: int) -> np.ndarray:
    import soxr

    return soxr.resample(audio, src, dst)


if __name__ == "__main__":
    sys.exit(main())
