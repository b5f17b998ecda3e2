"""The speaker models at run time: segmentation (who talks when, per 10 s window) and embedding.

Built by `python -m app.export speakers` into `<models-dir>/diarization/`; loaded on the device the
options name, chosen as for the Whisper sessions (AUTO: NPU, else GPU, else CPU). On a CPU they run
on ONNX Runtime's own CPU provider, not OpenVINO's: OpenVINO's CPU plugin kept 350-500 MB after
one diarization of a 60 s clip (compiled kernels and buffers per input length; the embedding's
input length changes with every speaker turn), ONNX Runtime's about 60 MB
(benchmarks/results/diarization_memory.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from app.engine.speakers.embedding import SpeakerEmbedding, TooLittleSpeech
from app.engine.speakers.segmentation import DEFAULT_STEP_S, SpeakerSegmentation, window_starts
from app.runtime.graphs import openvino_devices
from app.runtime.placement import RuntimeOptions, open_graph, resolve_device
from app.runtime.speaker_contract import EMBEDDING_FILE, FOLDER, SEGMENTATION_FILE

log = logging.getLogger(__name__)

__all__ = [
    "SpeakerEmbedding",
    "SpeakerModels",
    "SpeakerModelsMissing",
    "SpeakerSegmentation",
    "TooLittleSpeech",
    "load_speaker_models",
    "window_starts",
]


class SpeakerModelsMissing(FileNotFoundError):
    """The speaker models folder is not built."""


@dataclass(frozen=True)
class SpeakerModels:
    segmentation: SpeakerSegmentation
    embedding: SpeakerEmbedding
    device: str
    provider: str  # what runs both: "OpenVINO" or ONNX Runtime's "CPUExecutionProvider"


def load_speaker_models(
    models_dir: Path,
    options: RuntimeOptions | None = None,
    *,
    step_s: float = DEFAULT_STEP_S,
) -> SpeakerModels:
    """Both models from `<models_dir>/diarization/`, on `options`' device (AUTO: NPU, else GPU,
    else CPU; a device asked for by name that is missing is a `DeviceError`): OpenVINO's NPU or
    GPU, or ONNX Runtime's CPU provider (see the module docstring)."""
    options = options or RuntimeOptions()
    folder = Path(models_dir) / FOLDER
    missing = [f for f in (SEGMENTATION_FILE, EMBEDDING_FILE) if not (folder / f).is_file()]
    if missing:
        raise SpeakerModelsMissing(
            f"{folder} lacks {', '.join(missing)}: build it with "
            f"`python -m app.export speakers --models-dir {models_dir}`"
        )
    device = "CPU"
    if options.ep == "openvino":
        device = resolve_device(options.device, openvino_devices())
    ep = "cpu" if device.split(".")[0] == "CPU" else options.ep
    sessions = {}
    for name in (SEGMENTATION_FILE, EMBEDDING_FILE):
        started = time.perf_counter()
        sessions[name] = open_graph(
            folder / name,
            ep,
            device,
            options.threads,
            options.cache_dir,
            options.inference_precision,
            shrink_arena=True,
        )
        log.info("loaded %s on %s/%s in %.2f s", name, ep, device, time.perf_counter() - started)
    return SpeakerModels(
        segmentation=SpeakerSegmentation(sessions[SEGMENTATION_FILE], step_s),
        embedding=SpeakerEmbedding(sessions[EMBEDDING_FILE]),
        device=device,
        provider=sessions[EMBEDDING_FILE].provider,
    )
