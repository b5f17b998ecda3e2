"""Live transcription: one audio stream in, committed text out while the person speaks.

`host.LiveHost` admits the sessions of every live protocol (the adapters in `app.api.live`) and
starts their `runner.LiveRunner`, which drives a `session.StreamingSession` from the event loop;
the session wires admission (`admission`), passes (`window_pass`), the commit policy (`policy`),
the committed words and the buffer's context (`commits`) and what the client has been told
(`transcript`); the settings' defaults and ranges are defined once in `bounds`.
"""

from app.engine.audio import AudioDecodeError
from app.engine.vad import SileroVad, VadOptions
from app.service.live.events import (
    BufferCleared,
    CommittedText,
    Finalized,
    PartialText,
    SpeechStarted,
    SpeechStopped,
    StreamEvent,
    StreamSegment,
    StreamStats,
    VoiceActivity,
)
from app.service.live.host import Admission, LiveHost, Outbox, ending
from app.service.live.options import POLICIES, StreamingOptions
from app.service.live.pcm import ENCODINGS, FramedPcm, PcmInput
from app.service.live.runner import LiveLimits, LiveRunner
from app.service.live.session import StreamingSession

__all__ = [
    "ENCODINGS",
    "POLICIES",
    "Admission",
    "AudioDecodeError",
    "BufferCleared",
    "CommittedText",
    "Finalized",
    "FramedPcm",
    "LiveHost",
    "LiveLimits",
    "LiveRunner",
    "Outbox",
    "PartialText",
    "PcmInput",
    "SileroVad",
    "SpeechStarted",
    "SpeechStopped",
    "StreamEvent",
    "StreamSegment",
    "StreamStats",
    "StreamingOptions",
    "StreamingSession",
    "VadOptions",
    "VoiceActivity",
    "ending",
]
