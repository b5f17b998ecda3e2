"""Live transcription of one audio stream: incremental decoding with a commit policy.

A `StreamingSession` receives 16 kHz f32 audio in pieces of any size and produces typed events
(`app.service.live.events`): `PartialText` (the unstable tail, token by token while a pass
decodes), `CommittedText` (append-only), `StreamSegment` (a closed stretch of committed text),
`SpeechStarted`/`SpeechStopped` (the VAD's turns) and `Finalized` (everything before a pause
or a client commit is committed).

How:

    append() -> inbox -> advance(): admit audio into the buffer, the VAD per 32 ms chunk of it
                              (or listen() first, as the audio arrives: a Wyoming utterance);
                              what its events decide is data (`speech.Speech`, pure
                              transitions), the session executes the acts they return
                              buffer = contiguous audio not yet cut away (<= one 30 s window)
    decode(): every `step_s` of new speech: one pass over the whole buffer (`window_pass`);
              the commit policy (`policy`: LocalAgreement-2 or AlignAtt) says how many of the
              words after the committed ones become final. What is committed is data
              (`commits.Commits`): `commits.plan` gives the pass's forced prefix, `commits.step`
              / `commits.finalize` apply its result; the session executes what they return
              (commit, cut the buffer, show the partial).

- Committed segments are not decoded again: the closed segments whose words are all committed
  are forced as the decoder prefix of the next pass (one prefill call instead of a step per
  token), so each pass decodes only the uncommitted tail while the audio before it stays as
  context. Once the buffer is longer than `trim_s` it is cut at the end of a committed segment.
- VAD: while no one speaks nothing is decoded, so silence never turns into text. When speech
  has ended and `VadOptions.min_silence_s` of silence followed, the utterance is finalized:
  decoded once more if the last pass did not cover it, every remaining word committed. Its audio
  stays as context for the next utterance unless the silence lasts `context_gap_s`; then only
  `preroll_s` of audio is kept. A shorter silence (`pause_s`) commits the same way without
  ending the turn (the words before it are whole; AlignAtt never commits a pass's last word).
  A pass due less than the VAD's `speech_pad_s` into a silence waits for the pad: it holds the
  tail of the last word, which the VAD hears as silence ("Americans"' s).
- Audio that arrives faster than it is decoded waits in the inbox and the next pass covers all
  of it (coalescing); the buffer never exceeds one 30 s window (a pass on a buffer longer than
  `max_buffer_s` commits up to its last closed segment whatever the policy says).
- `flush()` (client commit, end of stream) finalizes everything received so far; `clear()`
  forgets what was received and not yet committed.
- Memory: the buffer (<= 30 s), the inbox (bounded by the caller) and the committed text.

Threads: `append`/`flush`/`clear` may be called from any thread (one at a time), `listen` from
any thread; `advance` and `decode` must be called by one caller at a time
(`app.service.live.runner`), on worker threads. Events are passed to `on_event` from the thread
that runs `listen`/`advance`/`decode`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

import numpy as np

from app.engine.turn import TurnModel
from app.engine.vad import SileroVad, VadEvent
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.runtime.steps import Steps
from app.service.live import commits, speech
from app.service.live.admission import AudioBuffer, Hearing, Inbox
from app.service.live.commits import Commits
from app.service.live.events import (
    BufferCleared,
    Finalized,
    StreamEvent,
    StreamStats,
    VoiceActivity,
)
from app.service.live.options import StreamingOptions
from app.service.live.speech import DropBefore, ForgetContext, Speech, Tell
from app.service.live.transcript import Transcript
from app.service.live.window_pass import Pass, PassRequest, PassRunner
from app.service.transcription.results import TimeSpent
from app.service.transcription.transcriber import Transcriber

log = logging.getLogger(__name__)

ADMIT_SLICE = SAMPLE_RATE // 4  # audio is admitted (VAD + buffer) 0.25 s at a time
FINAL_PASSES = 3  # most passes one finalization may take


class StreamingSession:
    """One live stream; see the module docstring."""

    def __init__(
        self,
        transcriber: Transcriber,
        options: StreamingOptions,
        vad: SileroVad | None = None,
        on_event: Callable[[StreamEvent], None] | None = None,
        turn_model: TurnModel | None = None,
    ) -> None:
        if options.vad is not None and vad is None:
            raise ValueError("options.vad is set but no VAD model was given")
        if options.turn is not None and turn_model is None:
            raise ValueError("options.turn is set but no turn model was given")
        self.transcriber = transcriber
        self.tokenizer = transcriber.tokenizer
        self.options = options
        self.on_event = on_event or (lambda _e: None)
        self.policy = options.commit_policy
        self.passes = PassRunner(transcriber, options)
        self._vad = (
            Hearing(vad, options.vad, options.pause_s)
            if vad is not None and options.vad is not None
            else None
        )
        self._prompt = (
            tuple(self.tokenizer.encode(" " + options.prompt.strip())) if options.prompt else ()
        )
        self.inbox = Inbox()
        self._buf = AudioBuffer(N_SAMPLES_PER_WINDOW + 2 * ADMIT_SLICE)
        self.transcript = Transcript(self.on_event)
        self.commits = Commits()
        self._turn_model = turn_model
        self._rules = speech.Rules.of(options)
        self.speech = Speech() if self._vad is not None else Speech.without_vad()  # admission's
        self._passes = 0
        self._skipped = 0
        self._decode = TimeSpent()

    # ---- input (any thread) ----------------------------------------------------------------
    def append(self, audio: np.ndarray) -> None:
        """Queue f32 [N] 16 kHz audio (cheap; the work happens in `listen`/`advance`/`decode`)."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if self._vad is not None and audio.shape[0]:
            self._vad.put(audio)  # heard before it can be admitted
        self.inbox.append(audio)

    def flush(self) -> None:
        """Finalize everything appended so far (client commit or end of stream)."""
        self.inbox.mark_flush()

    def clear(self) -> None:
        """Forget the audio appended so far that is not committed yet."""
        if self._vad is not None:
            self._vad.restart(self.inbox.received)
        self.inbox.mark_clear()

    def listen(self, until: int | None = None) -> None:
        """Run the VAD over the audio appended since, up to absolute sample `until` (all of it
        without; any thread: the runner calls it as audio arrives, while a pass decodes, for a
        session that must hear a pause at once): `VoiceActivity` events as it hears them;
        admission applies each when it reaches the audio that decided it. Admission itself hears
        only what it admits: the rest of a backlog waits for the next admission, so a pause's
        finalization does not first wait for the VAD over the audio after it."""
        if self._vad is not None:
            self._vad.listen(self._heard, until)

    def _heard(self, event: VadEvent) -> None:
        self.on_event(VoiceActivity(event.kind, round(event.sample / SAMPLE_RATE, 3)))

    @property
    def language(self) -> str | None:
        return self.passes.language

    @property
    def received_s(self) -> float:
        return self.inbox.received / SAMPLE_RATE

    @property
    def inbox_s(self) -> float:
        """Audio appended but not yet admitted (it waits for a pass when decoding lags)."""
        return self.inbox.samples / SAMPLE_RATE

    @property
    def text(self) -> str:
        """All committed text."""
        return self.transcript.text

    def stats(self) -> StreamStats:
        return StreamStats(
            received_s=self.received_s,
            committed_words=self.transcript.n_words,
            passes=self._passes,
            skipped_passes=self._skipped,
            decode_s=self._decode.total,
            buffer_s=self._buf.length / SAMPLE_RATE,
            inbox_s=self.inbox_s,
        )

    # ---- admission (VAD) -------------------------------------------------------------------
    def advance(self) -> bool:
        """Run VAD over queued audio and admit it into the buffer; True if a pass is due.

        Stops early when the buffer is full (a pass must cut it first) or a finalization is due.
        """
        cleared = self.inbox.take_clear() if self.speech.final_until is None else None
        if cleared is not None:
            self._restart_at(*cleared)
        while True:
            while self.speech.final_until is None:
                room = self._buf.capacity - self._buf.length - ADMIT_SLICE
                if self.speech.open and room <= 0:
                    break
                piece = self.inbox.take(ADMIT_SLICE)
                if piece is None:
                    break
                self._admit(piece)
            if self.speech.final_until is not None or not self.inbox.flush_due():
                break
            self._do(*speech.flushed(self.speech, self._view()))
            if self.speech.final_until is not None:
                break
        return self.decode_due()

    def _admit(self, piece: np.ndarray) -> None:
        """Admit a slice of audio: the VAD's events decided in it, then what the slice's end
        decides (`app.service.live.speech`), each executed before the next is taken."""
        self._buf.append(piece)
        if self._vad is None:
            return
        self.listen(self._buf.end)
        for event in self._vad.decided(self._buf.end):
            finished = None
            if speech.needs_judgement(self.speech, event.kind, self._rules):
                assert self._turn_model is not None
                finished = self._turn_model.probability(self._buf.view())
                log.debug("turn at %.2f s: P(finished) %.2f", event.sample / SAMPLE_RATE, finished)
            self._do(*speech.heard(self.speech, event.kind, event.sample, self._view(),
                                   self._rules, finished))  # fmt: skip
        self._do(*speech.admitted(self.speech, self._view(), self._rules))

    def _view(self) -> speech.Buffer:
        """What admission decides by: the buffer's span and whether it holds words."""
        held = self.commits
        return speech.Buffer(self._buf.start, self._buf.end, held.holds_words, bool(held.pending))

    def _do(self, state: Speech, acts: speech.Acts) -> None:
        """Execute what admission decided."""
        if state.final_until is not None and self.speech.final_until is None:
            log.debug("finalize (%s) at %.2f s", state.final_reason or "short pause",
                      state.final_until / SAMPLE_RATE)  # fmt: skip
        self.speech = state
        for act in acts:
            match act:
                case Tell(event=event):
                    self.on_event(event)
                case DropBefore(sample=sample):
                    self._buf.drop_before(sample)
                case ForgetContext():
                    if self.commits.committed:
                        log.debug("context dropped after a silence")
                    self.commits = self.commits.forget()

    def _restart_at(self, sample: int, clears: int) -> None:
        """After `clear()` (`clears` of them): the buffer and the words not committed are gone,
        the VAD starts afresh, and the stream goes on at absolute `sample`."""
        log.debug("cleared %.2f s of buffered audio", self._buf.length / SAMPLE_RATE)
        self._buf.restart(sample)
        self.commits = self.commits.forget()
        self.speech = speech.restarted(self.speech, sample, vad=self._vad is not None)
        if self._vad is not None:
            self.listen()
            self._vad.forget(sample)  # it restarted there as it heard the clear
        self.transcript.close_segment()
        self.transcript.partial("")
        for _ in range(clears):
            self.on_event(BufferCleared())

    def decode_due(self) -> bool:
        """A pass has work: a finalization, or `step_s` of new audio in an open utterance."""
        return speech.decode_due(self.speech, self._view(), self._rules, self._tail_due())

    def _tail_due(self) -> bool:
        """The speech went silent less than the pad ago: the pad (the tail of its last word,
        which the VAD hears as silence) arrives within `speech_pad_s`. A pass now would read
        that word cut, and the pause's finalization could not commit from it."""
        silent = self._vad.silent_since() if self._vad is not None else None
        return silent is not None and silent <= self._buf.end < silent + self._rules.pad

    @property
    def idle(self) -> bool:
        """Nothing queued and no pass due."""
        return self.inbox.samples == 0 and not self.decode_due() and not self.inbox.pending_marks

    # ---- decoding (worker thread) ----------------------------------------------------------
    def decode(self, cancel: threading.Event | None = None) -> None:
        """Run the due pass (if any) here and emit its events. Raises TranscriptionCancelled."""
        self.transcriber.run(self.decoding(cancel))

    def start_decode(self, cancel: threading.Event | None = None) -> Future[None]:
        """`decode` as a task on the model: its model calls on the model's scheduler, no thread
        waiting; the future ends once its events are emitted."""
        return self.transcriber.start(self.decoding(cancel))

    def decoding(self, cancel: threading.Event | None) -> Steps[None]:
        """The due pass (if any), as a resumable task."""
        if self.speech.final_until is not None:
            yield from self._finalize(cancel)
        elif self.decode_due():
            yield from self._step(cancel)

    def _finalize(self, cancel: threading.Event | None) -> Steps[None]:
        """Commit every word up to `_final_until`; the audio stays as context for what follows
        (VAD drops it after `context_gap_s` of silence; passes cut it at segment ends).

        When the decoder stopped early (its text ends `STALL_S` before the audio does), the
        buffer is cut after that text and the rest is decoded again (up to `FINAL_PASSES`)."""
        until, reason = self.speech.final_until, self.speech.final_reason
        assert until is not None
        paused = self._vad.paused_since() if self._vad is not None else None
        quiet = paused is not None and self.speech.decoded_until >= paused  # silence came after
        for attempt in range(FINAL_PASSES):
            fresh = None
            stale = attempt > 0 or (self.speech.decoded_until < until and not quiet)
            if stale and until - self._buf.start >= SAMPLE_RATE // 10:
                decoded = yield from self._run_pass(self._buf.view(until), cancel)
                self._decoded_to(decoded.end)
                fresh = decoded if decoded.usable else None  # else: what the last pass said
            self.commits, applied = commits.finalize(
                self.commits, fresh, self._buf.start, until, self.options, self.tokenizer,
                reread_last=reason == "flush",  # a client's commit: read it again
            )  # fmt: skip
            self._apply(applied)
            if not applied.stalled or until - self._buf.start < SAMPLE_RATE // 2:
                break
            log.debug(
                "finalize: decoding the %.2f s the decoder skipped",
                (until - self._buf.start) / SAMPLE_RATE,
            )
        self.speech = replace(self.speech, final_until=None)
        self.transcript.close_segment()
        self.transcript.partial("")
        if reason is not None:
            self.on_event(Finalized(reason, until / SAMPLE_RATE))

    def _decoded_to(self, end: int) -> None:
        self.speech = replace(self.speech, decoded_until=max(self.speech.decoded_until, end))

    def _step(self, cancel: threading.Event | None) -> Steps[None]:
        decoded = yield from self._run_pass(self._buf.view(), cancel)
        self.speech = replace(self.speech, decoded_until=decoded.end)
        self.commits, applied = commits.step(
            self.commits, decoded, self.policy, self.options, self.tokenizer
        )
        self._apply(applied)

    def _apply(self, applied: commits.Applied) -> None:
        """Execute what a pass's result says: commit, cut the buffer, show the partial."""
        self.transcript.commit(applied.commit, self.passes.language)
        if applied.cut is not None:
            self._buf.drop_before(applied.cut)
            self.transcript.close_segment()
        if applied.partial is not None:
            self.transcript.partial_words(applied.partial)

    def _run_pass(self, audio: np.ndarray, cancel: threading.Event | None) -> Steps[Pass]:
        """Decode the buffer's audio (up to some end); the committed closed segments are forced
        as a prefix (not decoded again)."""
        language = self.passes.language  # the stream's word split is its language's
        plan = commits.plan(self.commits, self.tokenizer, language)
        request = PassRequest(audio, self._buf.start, self._prompt + self._committed_prompt(),
                              plan.prefix)  # fmt: skip
        with self._decode:
            feed = self.transcript.token_feed(self.tokenizer, plan.skip, language)
            decoded = yield from self.passes.run(request, feed, cancel)
        log.debug("pass over %.2f s took %.0f ms", decoded.seconds, 1e3 * self._decode.last)
        self._passes += 1
        self._skipped += decoded.result is None or decoded.result.looped
        return decoded

    def _committed_prompt(self) -> tuple[int, ...]:
        if not self.options.condition_on_committed or self.transcript.empty:
            return ()
        return tuple(self.tokenizer.encode(self.transcript.tail(400))[-100:])
