"""The live session's VAD hears the audio as it arrives (`StreamingSession.listen`), ahead of
admission and while a pass decodes, and each 32 ms chunk goes through it once: the real tiny.en
model and Silero VAD."""

from __future__ import annotations

import numpy as np

from app.engine.vad import CHUNK_SAMPLES, SileroVad, VadEvent, VadOptions, VadState, VadStream
from app.runtime.contract import SAMPLE_RATE
from app.service.live import (
    SpeechStarted,
    SpeechStopped,
    StreamEvent,
    StreamingOptions,
    StreamingSession,
    VoiceActivity,
)
from app.service.live.session import ADMIT_SLICE
from app.service.transcription.transcriber import Transcriber
from tests.engine.conftest import JFK, clip

PAD = round(VadOptions().speech_pad_s * SAMPLE_RATE)  # the speech's tail after the VAD's end


class CountedVad:
    """The real VAD, counting the chunks it scores."""

    def __init__(self, vad: SileroVad) -> None:
        self.vad, self.chunks = vad, 0

    def chunk_prob(self, chunk: np.ndarray, state: VadState, gain: float | None = None) -> float:
        self.chunks += 1
        return self.vad.chunk_prob(chunk, state, gain)


def speech_with_a_pause() -> np.ndarray:
    """jfk, 1 s of silence, jfk again."""
    audio = clip(JFK)
    return np.concatenate([audio, np.zeros(SAMPLE_RATE, np.float32), audio])


def test_the_vad_hears_speech_before_the_session_admits_it(
    tiny_tr: Transcriber, vad: SileroVad
) -> None:
    events: list[StreamEvent] = []
    options = StreamingOptions(language="en", pause_s=0.2)
    session = StreamingSession(tiny_tr, options, vad, events.append)
    audio = speech_with_a_pause()
    for i in range(0, audio.shape[0], 1600):
        session.append(audio[i : i + 1600])
        session.listen()  # what the runner does as each chunk arrives
    heard = [e for e in events if isinstance(e, VoiceActivity)]
    assert [e.kind for e in heard][:1] == ["start"], heard
    assert {"pause", "end"} <= {e.kind for e in heard}, heard
    # nothing was admitted yet: no turn, no pass
    assert not [e for e in events if isinstance(e, SpeechStarted | SpeechStopped)]
    assert session.stats().buffer_s == 0 and session.stats().passes == 0

    while session.advance():  # admission applies what was heard, where it was decided
        session.decode()
    turns = [e for e in events if isinstance(e, SpeechStarted | SpeechStopped)]
    starts = [e.at for e in heard if e.kind == "start"]
    ends = [e.at for e in heard if e.kind == "end"]
    assert [e.at for e in turns if isinstance(e, SpeechStarted)] == starts
    assert [e.at for e in turns if isinstance(e, SpeechStopped)] == ends
    assert any(12.0 <= at < 12.5 for at in starts), heard  # the second jfk, after the silence


def test_each_chunk_goes_through_the_vad_once(tiny_tr: Transcriber, vad: SileroVad) -> None:
    """Heard on arrival or at admission (whichever comes first), never both."""
    counted = CountedVad(vad)
    session = StreamingSession(tiny_tr, StreamingOptions(language="en"), counted)  # type: ignore[arg-type]
    audio = speech_with_a_pause()
    for n, i in enumerate(range(0, audio.shape[0], 1000)):
        session.append(audio[i : i + 1000])
        if n % 3:
            session.listen()
        while session.advance():
            session.decode()
    session.flush()
    while session.advance():
        session.decode()
    assert counted.chunks == audio.shape[0] // CHUNK_SAMPLES
    assert session.text.lower().count("fellow americans") == 2, session.text


def jfk_first_pause(vad: SileroVad) -> tuple[int, VadEvent, int]:
    """jfk's first pause: (the sample whose chunk decides it, the event, where the VAD decides
    the speech came back)."""
    stream = VadStream(vad, VadOptions(), pause_s=0.3)
    decided = []
    audio = clip(JFK)
    for i in range(0, audio.shape[0], CHUNK_SAMPLES):
        decided += [(stream.position, e) for e in stream.feed(audio[i : i + CHUNK_SAMPLES])]
    (pause_at, pause), (resumed_at, _) = [(at, e) for at, e in decided if e.kind != "start"][:2]
    assert pause.kind == "pause", decided
    return pause_at, pause, resumed_at


def test_a_pause_the_last_pass_covered_is_committed_from_it_though_speech_was_heard_after(
    tiny_tr: Transcriber, vad: SileroVad
) -> None:
    """The VAD hears ahead of admission: by the time admission reaches jfk's first pause it has
    heard the silence end and "ask not" begin. The pause is judged where admission is, so the
    words of the pass that already covered it are committed without decoding again (a second
    pass there cost a base stream ~1 s for "Americans," at real-time pace)."""
    audio = clip(JFK)
    pause_at, pause, resumed_at = jfk_first_pause(vad)
    # the first pass ends inside the silence, past its pad and before the pause is decided
    covered = pause.sample + PAD
    assert covered < pause_at and pause_at <= covered + ADMIT_SLICE < resumed_at

    session = StreamingSession(tiny_tr, StreamingOptions(language="en", pause_s=0.3), vad)
    session.append(audio[:covered])
    assert session.advance()
    session.decode()
    assert session.stats().passes == 1 and "fellow americans" not in session.text.lower()

    session.append(audio[covered : round(3.6 * SAMPLE_RATE)])  # "ask" begins at ~3.3 s
    session.listen()  # what the runner does as the audio arrives, during the next pass
    assert session.advance()  # admission stops at the pause: its finalization is due
    session.decode()
    assert "fellow americans" in session.text.lower(), session.text
    assert session.stats().passes == 1, "the pause was decoded again"


def test_a_pass_waits_for_the_tail_of_the_word_before_a_silence(
    tiny_tr: Transcriber, vad: SileroVad
) -> None:
    """The VAD hears a word's soft tail ("Americans"' s) as silence: the speech's pad after it
    belongs to the word. A pass due just after the speech went silent waits for the pad, so it
    reads the last word whole and the pause's finalization commits from it without decoding
    again (a pass cut there read "America" and committed it)."""
    audio = clip(JFK)
    _, pause, _ = jfk_first_pause(vad)
    session = StreamingSession(tiny_tr, StreamingOptions(language="en", pause_s=0.3), vad)
    early = pause.sample + CHUNK_SAMPLES
    session.append(audio[:early])
    assert not session.advance(), "a pass would end inside the pad"
    session.append(audio[early : pause.sample + PAD])
    assert session.advance()
    session.decode()
    session.append(audio[pause.sample + PAD : round(3.0 * SAMPLE_RATE)])
    assert session.advance()  # the pause: its finalization is due
    session.decode()
    assert "my fellow americans" in session.text.lower(), session.text
    assert session.stats().passes == 1, "the pause was decoded again"


def test_admission_hears_only_the_audio_it_admits(tiny_tr: Transcriber, vad: SileroVad) -> None:
    """A backlog (the audio that arrived during a pass) is heard as it is admitted: admission
    stops at a pause to finalize it, and the VAD over the audio after the pause waits for the
    next admission instead of delaying that finalization."""
    counted = CountedVad(vad)
    options = StreamingOptions(language="en", pause_s=0.3)
    session = StreamingSession(tiny_tr, options, counted)  # type: ignore[arg-type]
    session.append(clip(JFK))
    assert session.advance()  # stopped at the first pause (~2.2 s): its finalization is due
    stats = session.stats()
    admitted = round((stats.received_s - stats.inbox_s) * SAMPLE_RATE)
    assert stats.inbox_s > 5.0, stats
    assert counted.chunks == admitted // CHUNK_SAMPLES, (counted.chunks, admitted)
