"""The browser page at `/`, driven in headless Chromium (Debian's `chromium`, via Playwright)
with a fake microphone that plays jfk.wav: the live transcript must appear on the page; an
uploaded file's transcript too, and with "Speakers" each speaker's turns, labelled and coloured.

`make setup-browser` installs Chromium (`make test` runs it). The screenshot is saved to
tests/artifacts/page_live_transcript.png.
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path

import pytest

from tests.api.conftest import JFK_WAV, LiveServer, normalise
from tests.conftest import REPO
from tests.conversation import two_speakers

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "tests" / "artifacts"
PHRASE = "ask not what your country can do for you"

pytestmark = pytest.mark.timeout(300)


def chromium_args(fake_audio: Path) -> list[str]:
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={fake_audio}",
        "--autoplay-policy=no-user-gesture-required",
    ]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `make setup-browser` (make test does it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=chromium_args(JFK_WAV)
        )
        yield browser
        browser.close()


def test_page_transcribes_the_microphone(server: LiveServer, browser, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context()
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(server.url("/"))
    assert page.title() == "Speech to text"
    page.click("#start")
    deadline = time.monotonic() + 120
    text = ""
    partial_shot = False
    while time.monotonic() < deadline:
        text = page.inner_text("#transcript")
        if not partial_shot and page.inner_text("#partial").strip():
            page.screenshot(path=str(ARTIFACTS / "page_partial_text.png"), full_page=True)
            partial_shot = True
        if PHRASE in normalise(text) and page.inner_text("#committed").strip():
            committed = normalise(page.inner_text("#committed"))
            if PHRASE in committed:
                break
        page.wait_for_timeout(250)
    shot = ARTIFACTS / "page_live_transcript.png"
    page.screenshot(path=str(shot), full_page=True)
    state = page.evaluate("window.sttState")
    assert PHRASE in normalise(page.inner_text("#committed")), (text, state, console)
    # the Realtime protocol's events, with the partial-text extension
    assert "conversation.item.input_audio_transcription.partial" in state["events"]
    assert "conversation.item.input_audio_transcription.delta" in state["events"]
    assert "conversation.item.input_audio_transcription.completed" in state["events"]
    assert "session.updated" not in state["events"]  # its settings came with its client secret
    # partial text is styled apart from committed text
    partial_style = page.eval_on_selector("#partial", "e => getComputedStyle(e).fontStyle")
    committed_style = page.eval_on_selector("#committed", "e => getComputedStyle(e).fontStyle")
    assert partial_style != committed_style
    page.click("#stop")
    page.wait_for_function("window.sttState.done !== null", timeout=60_000)
    assert PHRASE in normalise(page.evaluate("window.sttState.done"))
    shutil.copy(shot, tmp_path / shot.name)
    context.close()


def test_page_says_why_a_session_cannot_start_with_a_wrong_key(
    strict_server: LiveServer, browser
) -> None:
    page = browser.new_page()
    page.goto(strict_server.url("/"))
    page.fill("#apikey", "not-the-key")
    page.click("#start")
    page.wait_for_function("document.getElementById('status').textContent.includes('key')")
    assert page.inner_text("#status") == "cannot start a session: Incorrect API key provided."
    assert page.is_enabled("#start")
    page.close()


def test_page_file_upload_streams_sse(server: LiveServer, browser) -> None:
    page = browser.new_page()
    page.goto(server.url("/"))
    page.set_input_files("#file", str(JFK_WAV))
    page.click("#upload")
    page.wait_for_function(
        "document.getElementById('file-status').textContent === 'done'", timeout=120_000
    )
    assert PHRASE in normalise(page.inner_text("#file-transcript"))
    page.screenshot(path=str(ARTIFACTS / "page_file_upload.png"), full_page=True)
    page.close()


def test_page_shows_each_speaker_of_an_uploaded_file(
    server: LiveServer, browser, tmp_path: Path
) -> None:
    talk = tmp_path / "talk.wav"
    talk.write_bytes(two_speakers().wav)
    page = browser.new_page()
    page.goto(server.url("/"))
    page.set_input_files("#file", str(talk))
    page.check("#speakers")
    page.click("#upload")
    page.wait_for_function(
        "document.getElementById('file-status').textContent === 'done'", timeout=120_000
    )
    lines = page.eval_on_selector_all(
        "#file-transcript .segment",
        """lines => lines.map(l => [l.dataset.speaker, l.querySelector('.speaker').textContent,
            getComputedStyle(l.querySelector('.speaker')).backgroundColor, l.innerText])""",
    )
    page.screenshot(path=str(ARTIFACTS / "page_file_speakers.png"), full_page=True)
    page.close()
    assert [who for who, *_ in lines] == [label for _, label, *_ in lines]
    turns = [who for who, _ in itertools.groupby(who for who, *_ in lines)]
    assert turns == ["A", "B", "A"], lines
    colour = {who: background for who, _, background, _ in lines}
    assert len(set(colour.values())) == 2, colour  # each speaker its own colour
    b_text = normalise(" ".join(text for who, _, _, text in lines if who == "B"))
    assert "if the reader will excuse me" in b_text and "stuff" not in b_text
