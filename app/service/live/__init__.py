"""Live transcription: one audio stream in, committed text out while the person speaks.

`runner.LiveRunner` drives a `session.StreamingSession` from the event loop for every live
protocol (the WebSocket adapters in `app.api.live`); the session wires admission
(`admission`), passes (`window_pass`), the commit policy (`policy`), the buffer's committed
context (`context`) and what the client has been told (`transcript`).
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
)
from app.service.live.options import POLICIES, StreamingOptions
from app.service.live.pcm import ENCODINGS, FramedPcm, PcmInput
from app.service.live.runner import LimitExceeded, LiveLimits, LiveRunner
from app.service.live.session import StreamingSession

__all__ = [
    "ENCODINGS",
    "POLICIES",
    "AudioDecodeError",
    "BufferCleared",
    "CommittedText",
    "Finalized",
    "FramedPcm",
    "LimitExceeded",
    "LiveLimits",
    "LiveRunner",
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
]
