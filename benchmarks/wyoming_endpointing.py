"""Home Assistant with the server ending each voice command (`requires_external_vad: false`):
ours (semantic turn detection, `vad_sensitivity` default) against wyoming-faster-whisper with
`--vad-endpointing` (a fixed silence after Silero VAD's speech: 0.7 s, Home Assistant's own
default, unless `--peer-silence`), on the same weights and threads, greedy, English.

Commands: `benchmarks/data/devcorpus` utterances, each with a mid-sentence pause of 0.3-1.5 s
inserted at one of its word gaps (`benchmarks.turns.commands`, seeded). Each is sent as Home
Assistant streams a microphone: `transcribe`, `audio-start`, 100 ms chunks at real-time pace,
then silence chunks on until a `transcript` arrives (at most `--tail` s), then `audio-stop`.
Measured per command: cut, the transcript arrived before `CUT_WITHIN_S` after the inserted
pause's end (the command was ended at that pause or an earlier one, natural: what followed is
lost; read speech holds several sentences); the delay from the true end of speech (the
utterance's last loud frame: trailing breath or noise counts as loud, so it can be negative)
to the transcript; the WER of the transcripts against the references; and per command ours
minus the peer's time to the transcript (the same audio: the unreliable end cancels). Systems
alternate command by command.

    make bench-setup
    .venv/bin/python -m benchmarks.wyoming_endpointing --models tiny.en --commands 20

Writes benchmarks/results/wyoming_endpointing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient

from benchmarks import common
from benchmarks.common import REPO
from benchmarks.server import free_port, launch_server
from benchmarks.turns import RATE, Command, commands
from benchmarks.wyoming_latency import start_peer

CHUNK = RATE // 10  # 100 ms
CUT_WITHIN_S = 1.0  # a transcript this soon after the inserted pause ended answered at the pause


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en")
    p.add_argument("--commands", type=int, default=20, help="devcorpus utterances")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tail", type=float, default=6.0, help="most silence streamed after speech")
    p.add_argument("--peer-silence", type=float, default=0.7, help="peer --vad-endpointing s")
    p.add_argument("--models-dir", type=Path, default=REPO / "models")
    common.add_args(p)
    return p.parse_args()


async def command(port: int, said: Command, tail_s: float) -> tuple[float | None, float, str]:
    """(seconds from the true end of speech to the transcript, None if it came inside the
    speech; seconds after the true end it came; its text)."""
    pcm = (np.clip(said.audio, -1, 1) * 32767).astype("<i2").tobytes()
    pcm += b"\0\0" * int(tail_s * RATE)
    got: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()
    async with AsyncTcpClient("127.0.0.1", port) as client:

        async def read() -> None:
            while (event := await client.read_event()) is not None:
                if Transcript.is_type(event.type) and not got.done():
                    got.set_result((time.monotonic(), Transcript.from_event(event).text))

        reader = asyncio.create_task(read())
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        started, step = time.monotonic(), CHUNK * 2
        for i, offset in enumerate(range(0, len(pcm), step)):
            if got.done():
                break
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[offset : offset + step])
            await client.write_event(chunk.event())
            ahead = started + (i + 1) * 0.1 - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await client.write_event(AudioStop().event())
        answered, text = await asyncio.wait_for(got, 120)
        reader.cancel()
    after_end = answered - (started + said.end / RATE)
    cut = answered < started + said.pause[1] / RATE + CUT_WITHIN_S
    return (None if cut else after_end), after_end, text


def start_ours(model: str, models_dir: Path, threads: int) -> tuple:
    port = free_port()
    settings = {"STT_THREADS": str(threads), "STT_WYOMING_PORT": str(port),
                "STT_WYOMING_HOST": "127.0.0.1"}  # fmt: skip
    return launch_server(model, models_dir, settings), port


def measure(model: str, said: list[Command], args: argparse.Namespace) -> dict:
    ours, port = start_ours(model, args.models_dir, args.threads)
    systems = {"ours (semantic, default)": port}
    peer_name = f"wyoming-faster-whisper --vad-endpointing {args.peer_silence:g}"
    results: dict[str, list[tuple[float | None, float, str]]] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        peer, peer_port = start_peer(
            model, args.threads, Path(data_dir), ["--vad-endpointing", str(args.peer_silence)]
        )
        systems[peer_name] = peer_port
        results = {name: [] for name in systems}
        load = common.load1()
        try:
            for i, one in enumerate(said):
                for name in common.rotate(list(systems), i):
                    outcome = asyncio.run(command(systems[name], one, args.tail))
                    results[name].append(outcome)
                    print(f"[{model}] {i} {name}: {outcome[1]:+.2f} s {outcome[2]!r}",
                          file=sys.stderr)  # fmt: skip
        finally:
            ours.stop()
            peer.terminate()
            peer.wait(15)
    return {"model": model, "results": results, "load": load}


def main() -> None:
    args = parse_args()
    load = common.start_load(args)
    said = commands(args.seed, args.commands)
    measured = [measure(m, said, args) for m in args.models.split(",")]
    lines = common.header(
        "Wyoming, the server ending commands: ours vs wyoming-faster-whisper --vad-endpointing",
        load,
        [
            f"{len(said)} devcorpus utterances (seed {args.seed}), each with a mid-sentence pause "
            "of 0.3-1.5 s at one of its word gaps, streamed at real-time pace, then silence "
            f"until the transcript (at most {args.tail:g} s), then audio-stop; same weights, "
            f"{args.threads} threads, greedy. cut: the transcript came within {CUT_WITHIN_S:g} s "
            "of the inserted pause's end; delay: the last loud frame -> transcript, over the "
            "commands not cut; WER of all transcripts against the references.",
        ],
    )
    rows = []
    refs = [c.text for c in said]
    for m in measured:
        (ours, theirs) = m["results"].values()
        paired = [a[1] - b[1] for a, b in zip(ours, theirs, strict=True)]
        for name, outcomes in m["results"].items():
            delays = [d for d, _, _ in outcomes if d is not None]
            cut = sum(d is None for d, _, _ in outcomes)
            wer = common.wer(refs, [text for _, _, text in outcomes])[0]
            median = f"{statistics.median(delays):.2f}" if delays else "-"
            rows.append([m["model"], name, f"{cut}/{len(outcomes)}", median, f"{wer:.1f}",
                         f"{m['load']:.2f}"])  # fmt: skip
        later, median = sum(d > 1.0 for d in paired), statistics.median(paired)
        rows.append([m["model"], "ours - peer, per command", "", f"{median:+.2f}",
                     f"ours > 1 s later on {later}/{len(paired)}", ""])  # fmt: skip
    head = ["model", "system", "cut", "delay median s", "WER %", "load"]
    lines += ["", *common.table(head, rows)]
    common.write(args.out_dir / "wyoming_endpointing.md", lines)


if __name__ == "__main__":
    main()
