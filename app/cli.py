"""Command-line interface: `python -m app transcribe FILE [options]`.

The transcript goes to stdout in the chosen format; with --verbose, load and per-stage timings
(mel, encoder, decoder, tokens/s, real-time factor, K/V cache bytes, input bytes handed to the
runtime per decoder call) go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from app.api.speaker_formats import diarized_body
from app.engine.audio import AudioDecodeError, decode_audio
from app.engine.kv_cache import CACHE_MODES
from app.engine.tokenizer import Tokenizer
from app.engine.vad import VAD_FILE, SileroVad, VadModelError
from app.export.errors import BuildError
from app.export.vad import ensure_sequence_graphs
from app.runtime.blas import quiet_blas
from app.runtime.contract import ContractError
from app.runtime.memory import tune_malloc
from app.runtime.placement import (
    ACTIVATION_QUANTIZATION,
    DEVICES,
    EXECUTION_PROVIDERS,
    DeviceError,
    RuntimeOptions,
)
from app.runtime.sessions import WhisperSessions
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import LazyDiarizer, SpeakerJob, transcribe_speakers
from app.service.errors import Rejected
from app.service.models.loaded import LoadedModel
from app.service.transcription import formats
from app.service.transcription.jobs import TranscriptionJob
from app.service.transcription.results import TranscriptionInfo
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions

log = logging.getLogger("app.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app", description="Whisper speech-to-text")
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("transcribe", help="transcribe (or translate) an audio file")
    t.add_argument("file", type=Path, help="audio or video file: wav, flac, mp3, m4a, webm, ...")
    t.add_argument("--model", default="base", help="model folder name (default: base)")
    t.add_argument("--models-dir", type=Path, default=Path("models"))
    t.add_argument("--language", default=None, help="language code; default: detect")
    t.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    t.add_argument("--beam-size", type=int, default=5, help="beams at temperature 0 (1 = greedy)")
    t.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="a single sampling temperature (default: fallback 0, 0.2 ... 1.0)",
    )
    t.add_argument("--initial-prompt", default=None, help="text to condition the first window on")
    t.add_argument("--without-timestamps", action="store_true", help="no timestamp tokens")
    t.add_argument(
        "--vad-filter",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="transcribe only the speech Silero VAD finds (models-dir/silero_vad.onnx; default on)",
    )
    t.add_argument(
        "--word-timestamps",
        action="store_true",
        help="time every word (json and verbose_json print them)",
    )
    t.add_argument(
        "--kv-cache",
        choices=CACHE_MODES,
        default="concat",
        help="self-attention cache (a decoder on an NPU always uses static)",
    )
    t.add_argument("--ep", choices=EXECUTION_PROVIDERS, default="openvino")
    t.add_argument("--device", default="AUTO", help=f"OpenVINO device: {', '.join(DEVICES)}")
    t.add_argument(
        "--npu-emulation",
        action="store_true",
        help="run the NPU device through OpenVINO's NPU plugin with NPUW on the CPU",
    )
    t.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = all cores)")
    t.add_argument(
        "--precision",
        choices=("bf16", "f16", "f32"),
        default=None,
        help="OpenVINO inference precision hint (default: the device's)",
    )
    t.add_argument(
        "--activation-quantization",
        choices=ACTIVATION_QUANTIZATION,
        default="auto",
        help="OpenVINO CPU, int8 files: quantize the linear layers' inputs too "
        "(auto = where the CPU computes f32)",
    )
    t.add_argument(
        "--format", choices=("text", "json", "verbose_json", "srt", "vtt"), default="text"
    )
    t.add_argument(
        "--diarize",
        action="store_true",
        help="say who spoke each segment (speakers A, B, ...; models-dir/diarization): text prints "
        "'A: ...' lines, json the diarized_json shape",
    )
    t.add_argument(
        "--num-speakers", type=int, default=None, help="with --diarize: how many speakers talk"
    )
    t.add_argument("--verbose", "-v", action="store_true", help="timings and logs on stderr")
    return parser


def transcribe_command(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    audio = decode_audio(args.file)  # a bad file fails before the model loads
    audio_s = time.perf_counter() - t0

    folder = args.models_dir / args.model
    started = time.perf_counter()
    runtime = RuntimeOptions(
        ep=args.ep,
        device=args.device,
        threads=args.threads,
        inference_precision=args.precision,
        activation_quantization=args.activation_quantization,
        npu_emulation=args.npu_emulation,
    )
    sessions = WhisperSessions.load(folder, runtime)
    tokenizer = Tokenizer.from_folder(folder, sessions.manifest)
    load_s = time.perf_counter() - started

    changes: dict[str, object] = {}
    if args.temperature is not None:
        changes["temperature"] = (args.temperature,)
    options = TranscriptionOptions(
        language=args.language,
        task=args.task,
        beam_size=args.beam_size,
        initial_prompt=args.initial_prompt,
        without_timestamps=args.without_timestamps,
        vad_filter=args.vad_filter,
        kv_cache=args.kv_cache,
        word_timestamps=args.word_timestamps,
        **changes,  # type: ignore[arg-type]
    )
    if args.num_speakers is not None and not args.diarize:
        raise ValueError("--num-speakers needs --diarize")
    vad = None
    if args.vad_filter:
        ensure_sequence_graphs(args.models_dir)  # a folder made before they were built
        vad = SileroVad.load(args.models_dir / VAD_FILE)
    if args.diarize:
        model = LoadedModel(args.model, sessions, tokenizer, options, load_s, int(time.time()), vad)
        info = print_speakers(args, model, runtime)
    else:
        info = print_transcript(args, Transcriber(sessions, tokenizer, vad=vad), audio, options)
    if args.verbose:
        print_timings(args, sessions.devices, info, load_s, audio_s)
    return 0


def print_speakers(
    args: argparse.Namespace, model: LoadedModel, runtime: RuntimeOptions
) -> TranscriptionInfo:
    """Transcribe with speakers and print them in `args.format`."""
    if args.task != "transcribe":
        raise ValueError("--diarize finds speakers for transcriptions, not translations")
    diarizer = LazyDiarizer(args.models_dir, runtime).get()
    hints = SpeakerHints(num_speakers=args.num_speakers)
    job = TranscriptionJob(args.file.read_bytes(), model.base_options)
    result = transcribe_speakers(model, diarizer, job, SpeakerJob(hints))
    if args.format == "text":
        for segment in result.segments:
            print(f"{segment.speaker}: {segment.text.strip()}")
    else:
        granularities = ("segment", "word") if args.word_timestamps else ("segment",)
        shape = "diarized_json" if args.format == "json" else args.format
        body = diarized_body(result, shape, granularities)
        if not isinstance(body, str):
            body = json.dumps(body, indent=2, ensure_ascii=False) + "\n"
        print(body, end="")
    return result.transcription.info


def print_transcript(
    args: argparse.Namespace,
    transcriber: Transcriber,
    audio: np.ndarray,
    options: TranscriptionOptions,
) -> TranscriptionInfo:
    """Transcribe and print the transcript in `args.format`."""
    segments_iter, info = transcriber.transcribe(audio, options)
    if args.format == "text":
        # print as the segments come: the first ones appear before the whole file is done
        first = True
        for segment in segments_iter:
            text = segment.text.lstrip() if first else segment.text
            print(text, end="", flush=True)
            first = False
        print()
    else:
        segments = list(segments_iter)
        if args.format == "json":
            print(formats.to_json(segments))
        elif args.format == "verbose_json":
            print(formats.to_verbose_json(segments, info, task=args.task))
        elif args.format == "srt":
            print(formats.to_srt(segments), end="")
        else:
            print(formats.to_vtt(segments), end="")
    return info


def print_timings(
    args: argparse.Namespace,
    devices: Mapping[str, str],
    info: TranscriptionInfo,
    load_s: float,
    audio_s: float,
) -> None:
    """Load and per-stage timings on stderr (--verbose)."""
    s = info.stats
    err = sys.stderr
    print(
        f"model {args.model} ({args.ep}: encoder {devices['encoder']}, decoder "
        f"{devices['decoder']}), kv-cache {args.kv_cache}, beam {args.beam_size}",
        file=err,
    )
    print(f"load          {load_s * 1000:9.1f} ms", file=err)
    print(f"audio decode  {audio_s * 1000:9.1f} ms  ({s.audio_s:.2f} s of audio)", file=err)
    if s.vad_s:
        print(f"vad           {s.vad_s * 1000:9.1f} ms", file=err)
    print(f"mel           {s.mel_s * 1000:9.1f} ms", file=err)
    print(f"encoder       {s.encoder_s * 1000:9.1f} ms  ({s.windows} windows)", file=err)
    if s.language_s:
        print(
            f"language      {s.language_s * 1000:9.1f} ms  ({info.language}, "
            f"p={info.language_probability:.2f})",
            file=err,
        )
    print(f"prefill       {s.prefill_s * 1000:9.1f} ms", file=err)
    print(
        f"decoder       {s.decoder_s * 1000:9.1f} ms  ({s.steps} steps, "
        f"{s.ms_per_step:.2f} ms/step, {s.tokens_per_s:.1f} tokens/s)",
        file=err,
    )
    print(f"search        {s.search_s * 1000:9.1f} ms  (filters, selection)", file=err)
    if s.align_s:
        print(f"word timing   {s.align_s * 1000:9.1f} ms  (aligner, DTW)", file=err)
    print(f"attempts      {s.attempts:9d}     ({s.fallbacks} temperature fallbacks)", file=err)
    print(f"K/V cache     {s.cache_nbytes / 1e6:9.1f} MB  (peak, cross + self)", file=err)
    print(
        f"handed over   {s.handed_per_call / 1e6:9.2f} MB  per decoder call (inputs; "
        f"{s.decoder_calls} calls)",
        file=err,
    )
    print(f"total         {s.total_s * 1000:9.1f} ms  RTF {s.rtf:.3f}", file=err)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    tune_malloc()
    quiet_blas()
    try:
        if args.command == "transcribe":
            return transcribe_command(args)
    except (
        AudioDecodeError,
        BuildError,
        ContractError,
        DeviceError,
        VadModelError,
        ValueError,
        FileNotFoundError,
        Rejected,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 1
