"""Client half of the scale-out test (tests/scaleout/run.sh): a Swarm stack of 2 replicas behind
HAProxy, driven with the official openai SDK (REST) and `websockets` (Realtime sessions).

Not collected by pytest; run.sh calls one scenario at a time:

    driver.py spread    --url http://127.0.0.1:PORT
    driver.py unhealthy ...   (docker pause one replica: out of rotation within 5 s)
    driver.py kill ...        (docker kill one replica under load: REST all succeed)
    driver.py update ...      (docker service update --force under load: nothing fails)

Every REST request sends jfk.wav and must get its text; `X-Upstream` (set by HAProxy) tells which
replica answered. Sessions stream jfk in a loop at real-time pace over the Realtime protocol
(server VAD: each spoken sentence is an item) and read while they send.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from openai import APIStatusError, AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parents[2]
JFK = REPO / "tests" / "data" / "audio" / "jfk.wav"
JFK_WORDS = "ask not what your country can do for you"
JFK_SENTENCE = (
    "and so my fellow americans ask not what your country can do for you "
    "ask what you can do for your country"
)
SERVICE = "stt_stt"  # <stack>_<service>
PROXY = "stt_haproxy"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9']+", " ", text.lower()).split())


def log(message: str) -> None:
    print(f"[driver {time.strftime('%H:%M:%S')}] {message}", flush=True)


def docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True
    ).stdout.strip()


# ---- HAProxy's view ------------------------------------------------------------------------


def haproxy(command: str) -> str:
    """A command on HAProxy's runtime API (a TCP socket on the container's loopback)."""
    cid = docker("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={PROXY}")
    script = f"exec 3<>/dev/tcp/127.0.0.1/9999; echo '{command}' >&3; cat <&3"
    return docker("exec", cid.split()[0], "bash", "-c", script)


def servers() -> dict[str, str]:
    """Backend servers with an address -> "UP" or "DOWN" (`show servers state`; slots of the
    template that resolve to no replica are left out)."""
    out = {}
    for line in haproxy("show servers state stt").splitlines():
        fields = line.split()
        if len(fields) < 7 or not fields[0].isdigit():
            continue  # the version line and the header
        name, addr, op_state, admin_state = fields[3], fields[4], fields[5], int(fields[6])
        if admin_state == 0 and addr not in ("-", "0.0.0.0"):
            out[f"{name}@{addr}"] = "UP" if op_state == "2" else "DOWN"
    return out


def up() -> list[str]:
    return sorted(name for name, status in servers().items() if status == "UP")


async def wait_until(predicate, timeout_s: float, what: str, every: float = 0.25) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        await asyncio.sleep(every)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def containers() -> dict[str, str]:
    """Running replicas of the app service: container id -> address on the stack's network."""
    out = {}
    for cid in docker(
        "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={SERVICE}"
    ).split():
        nets = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", cid))
        out[cid] = next(n["IPAddress"] for name, n in nets.items() if name.endswith("_stt"))
    return out


# ---- REST ------------------------------------------------------------------------------------


@dataclass
class RestResults:
    upstreams: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    done: int = 0


async def rest_requests(
    url: str, count: int, concurrency: int, retries: int, results: RestResults
) -> None:
    """`count` transcriptions of jfk through the openai SDK, `concurrency` at a time."""
    audio = JFK.read_bytes()
    client = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="x",
        max_retries=retries,
        timeout=120,
        http_client=httpx.AsyncClient(trust_env=False, timeout=120),
    )
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            queue.get_nowait()
            try:
                raw = await client.audio.transcriptions.with_raw_response.create(
                    model="tiny.en", file=("jfk.wav", audio, "audio/wav")
                )
                text = raw.parse().text
                if JFK_WORDS not in normalise(text):
                    results.failures.append(f"wrong text {text!r}")
                results.upstreams[raw.headers.get("x-upstream", "?")] += 1
            except APIStatusError as e:
                results.failures.append(f"{e.status_code} {e.message}")
            except Exception as e:  # connection errors after the SDK's retries
                results.failures.append(f"{type(e).__name__}: {e}")
            results.done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()


# ---- Realtime sessions -----------------------------------------------------------------------


def pcm24k() -> bytes:
    """jfk.wav as PCM16 at 24 kHz (the Realtime protocol's rate), with 1 s of silence after."""
    import soundfile as sf

    audio, rate = sf.read(JFK, dtype="float32")
    n = int(len(audio) * 24000 / rate)
    audio = np.interp(np.arange(n) * rate / 24000, np.arange(len(audio)), audio)
    audio = np.concatenate([audio, np.zeros(24000)])
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


@dataclass
class Session:
    upstream: str = "?"
    close_code: int | None = None
    started: int = 0  # items whose speech started
    transcripts: list[str] = field(default_factory=list)  # completed items
    error: str | None = None
    last_event: float = 0.0  # monotonic time of the last server event


async def realtime_session(url: str, seconds: float, session: Session) -> None:
    """Stream jfk in a loop for at most `seconds` (real-time pace), reading all along; ends when
    the time is up (then waits for the last item) or when the server closes."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    pcm = pcm24k()
    chunk = 4800  # 100 ms
    try:
        async with connect(ws_url, proxy=None, max_size=2**22) as ws:
            session.upstream = ws.response.headers.get("X-Upstream", "?")

            async def read() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for message in ws:
                        event = json.loads(message)
                        session.last_event = time.monotonic()
                        if event["type"] == "input_audio_buffer.speech_started":
                            session.started += 1
                        elif event["type"] == COMPLETED:
                            session.transcripts.append(event["transcript"])
                        elif event["type"] == "error":
                            session.error = json.dumps(event["error"])

            reader = asyncio.create_task(read())
            deadline = time.monotonic() + seconds
            with contextlib.suppress(ConnectionClosed):
                while time.monotonic() < deadline and not reader.done():
                    for offset in range(0, len(pcm), chunk):
                        audio = base64.b64encode(pcm[offset : offset + chunk]).decode()
                        await ws.send(
                            json.dumps({"type": "input_audio_buffer.append", "audio": audio})
                        )
                        await asyncio.sleep(0.1)
                        if reader.done():
                            break
                # the last item completes after the trailing silence; then close. On an AVX2-only
                # EPYC one tiny.en window takes 0.8 s on one thread, so a replica carrying two
                # sessions and REST load runs well behind real time and catches up afterwards.
                await asyncio.wait_for(_settled(ws, session, bytes(chunk)), 150)
                await ws.close()
            await reader
        session.close_code = ws.close_code
    except Exception as e:
        session.error = f"{type(e).__name__}: {e}"


async def _settled(
    ws: ClientConnection, session: Session, silence: bytes, quiet_s: float = 5.0
) -> None:
    """Every started item completed and the server quiet for `quiet_s`: a server behind real
    time (a slow CPU: AVX2 only, two replicas and REST load on 2 cores) still has audio to read,
    and items it has not started yet; closing at the first balance lost them. Meanwhile the
    client goes on sending silence, as a microphone does: a wait of over 30 s without a message
    (the survivor of `kill` catching up) was closed by the server's idle timeout."""
    audio = json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(silence).decode()}
    )
    while (
        len(session.transcripts) < session.started
        or time.monotonic() - session.last_event < quiet_s
    ):
        await ws.send(audio)
        await asyncio.sleep(0.1)


def check_session(session: Session, *, drained: bool | None = None) -> list[str]:
    """What is wrong with a finished session (empty = fine): every started item completed, the
    jfk words in them, the expected close."""
    problems = []
    if session.error:
        problems.append(f"error {session.error}")
    if len(session.transcripts) < session.started:
        problems.append(f"{session.started} items started, {len(session.transcripts)} completed")
    heard = set(normalise(" ".join(session.transcripts)).split())
    expected = set(JFK_SENTENCE.split())
    if len(heard & expected) < 0.8 * len(expected):  # live decoding may miss a word or two
        problems.append(f"jfk's words missing from {session.transcripts}")
    if drained is True and session.close_code != 1001:
        problems.append(f"closed {session.close_code}, expected 1001 (drained)")
    if drained is False and session.close_code not in (1000, 1001):
        problems.append(f"closed {session.close_code}")
    return problems


# ---- scenarios -------------------------------------------------------------------------------


async def spread(args: argparse.Namespace) -> None:
    """16 REST + 2 sessions: all correct, each replica >= 25 % of the REST requests."""
    rest = RestResults()
    sessions = [Session(), Session()]
    await asyncio.gather(
        rest_requests(args.url, 16, 4, 2, rest),
        *(realtime_session(args.url, 12, s) for s in sessions),
    )
    log(f"REST by replica: {dict(rest.upstreams)}; sessions on {[s.upstream for s in sessions]}")
    assert not rest.failures, rest.failures
    assert rest.done == 16
    assert len(rest.upstreams) == 2 and min(rest.upstreams.values()) >= 4, rest.upstreams
    for s in sessions:
        assert not check_session(s, drained=False), check_session(s, drained=False)
    log("spread OK")


async def unhealthy(args: argparse.Namespace) -> None:
    """A paused replica (its health checks time out) is out of rotation within 5 s."""
    replicas = containers()
    cid, addr = next(iter(replicas.items()))
    target = next(name for name in up() if name.endswith(f"@{addr}"))
    docker("pause", cid)
    try:
        took = await wait_until(lambda: target not in up(), 10, "taken out", 0.1)
        log(f"paused {cid[:12]} ({target}): out of rotation after {took:.1f} s")
        rest = RestResults()
        await rest_requests(args.url, 4, 2, 0, rest)
        assert not rest.failures, rest.failures
        assert target.split("@")[0] not in rest.upstreams, rest.upstreams
    finally:
        docker("unpause", cid)
    await wait_until(lambda: target in up(), 20, "back in rotation")
    assert took <= 5.0, f"out of rotation after {took:.1f} s"
    log("unhealthy OK")


async def kill(args: argparse.Namespace) -> None:
    """docker kill one replica under load (24 REST + 3 sessions): every REST request succeeds
    after the SDK's retries, sessions on the other replica finish, Swarm replaces the task."""
    rest = RestResults()
    sessions = [Session() for _ in range(3)]
    load = asyncio.gather(
        rest_requests(args.url, 24, 6, 4, rest),
        *(realtime_session(args.url, 25, s) for s in sessions),
    )
    await wait_until(lambda: rest.done >= 3, 120, "3 requests done")
    await wait_until(lambda: all(s.upstream != "?" for s in sessions), 30, "sessions placed")
    # the victim: the replica with the fewest sessions (so some session is on the survivor)
    by_addr = {addr: cid for cid, addr in containers().items()}
    placed = collections.Counter(s.upstream for s in sessions)
    name, victim_addr = min((n.split("@") for n in up()), key=lambda na: placed.get(na[0], 0))
    victim = {name}
    docker("kill", by_addr[victim_addr])
    log(f"killed {by_addr[victim_addr][:12]} ({victim_addr}) after {rest.done} requests")
    await load
    survivors = [s for s in sessions if s.upstream not in victim]
    where = [(s.upstream, s.close_code) for s in sessions]
    log(f"REST by replica: {dict(rest.upstreams)}; sessions (replica, close) {where}")
    assert not rest.failures, rest.failures
    assert rest.done == 24
    assert survivors, "no session was on the surviving replica"
    for s in survivors:
        assert not check_session(s, drained=False), check_session(s, drained=False)
    took = await wait_until(lambda: len(up()) == 2, 180, "Swarm replaces the task", 1)
    log(f"the replacement is in rotation {took:.0f} s after the load ended")
    log("kill OK")


async def update(args: argparse.Namespace) -> None:
    """docker service update --force under load: no REST attempt fails (the SDK does not
    retry here), and every live session gets its final transcript and close 1001."""
    rest = RestResults()
    sessions = [Session() for _ in range(2)]
    stop = asyncio.Event()
    proc = await asyncio.create_subprocess_exec(
        "docker", "service", "update", "--force", "--quiet", SERVICE,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def rest_until_done() -> None:
        while not stop.is_set():
            await rest_requests(args.url, 2, 2, 0, rest)

    async def sessions_until_drained() -> None:
        await asyncio.gather(*(realtime_session(args.url, 300, s) for s in sessions))

    started = time.monotonic()
    drivers = asyncio.gather(rest_until_done(), sessions_until_drained())
    _, err = await proc.communicate()
    log(f"service update finished in {time.monotonic() - started:.0f} s (rc {proc.returncode})")
    assert proc.returncode == 0, err.decode()
    await wait_until(lambda: len(up()) == 2, 120, "both new replicas in rotation")
    stop.set()
    await drivers
    log(f"REST: {rest.done} requests by replica {dict(rest.upstreams)}; sessions "
        f"{[(s.upstream, s.close_code, len(s.transcripts)) for s in sessions]}")  # fmt: skip
    assert not rest.failures, rest.failures
    assert rest.done >= 10, rest.done
    for s in sessions:
        assert not check_session(s, drained=True), check_session(s, drained=True)
    log("update OK")


SCENARIOS = {"spread": spread, "unhealthy": unhealthy, "kill": kill, "update": update}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--url", required=True, help="HAProxy, e.g. http://127.0.0.1:18000")
    args = parser.parse_args()
    try:
        asyncio.run(SCENARIOS[args.scenario](args))
    except AssertionError as e:
        log(f"FAIL {args.scenario}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
