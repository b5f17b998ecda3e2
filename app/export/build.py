"""Build a model folder: weights -> encoder.onnx, decoder.onnx, tokenizer.json and
manifest.json.

The folder is written under a temporary name and renamed when complete, so a failed build leaves
nothing half-written in the models folder.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from app.export.calibration import measure_decoder_ranges, measure_ranges
from app.export.errors import BuildError
from app.export.graph_builder import WeightFormat
from app.export.manifest import build_manifest
from app.export.sources import (
    MODEL_NAME,
    ResolvedSource,
    fetch_catalog_model,
    resolve_local_folder,
    sha256_of,
)
from app.export.whisper_graphs import build_decoder, build_encoder
from app.runtime.contract import ContractError, Manifest, missing_files

log = logging.getLogger(__name__)

PRECISIONS = {
    "fp32": WeightFormat("float32"),
    "fp16": WeightFormat("float16"),
    "int8": WeightFormat("float16", int8_matrices=True, int8_inputs=True),
}


@dataclass(frozen=True)
class BuildSummary:
    name: str
    folder: Path
    precision: str
    seconds: float
    file_sizes: dict[str, int]
    peak_rss_mb: float

    def line(self) -> str:
        sizes = ", ".join(f"{f} {n / 1e6:.1f} MB" for f, n in self.file_sizes.items())
        return (
            f"built {self.name} ({self.precision}) in {self.seconds:.1f} s -> {self.folder}: "
            f"{sizes}; peak RSS {self.peak_rss_mb:.0f} MB"
        )


def _save(model: onnx.ModelProto, path: Path) -> list[str]:
    """Write `model` to `path` and its weights to `<file>.data` beside it; returns the names of
    the files written. Always external: a graph over protobuf's 2 GB limit must be, and OpenVINO
    maps an external file read-only instead of copying the weights into the process, so the
    runtime can drop those pages once the weights are packed (`app.runtime.mapped_weights`:
    large-v3-turbo 2.48 -> 1.58 GB after load, `benchmarks/results/memory_sizes.md`)."""
    data = f"{path.name}.data"
    onnx.save(model, path, save_as_external_data=True, location=data, size_threshold=1024)
    return [path.name, data]


def _probed_ranges(
    probe: onnx.ModelProto, folder: Path, measure: Callable[[Path], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """`measure(path)` of a probe graph written to `folder`/probe for the measurement."""
    path = folder / "probe" / "graph.onnx"
    path.parent.mkdir()
    try:
        _save(probe, path)
        del probe
        return measure(path)
    finally:
        shutil.rmtree(path.parent)


def _stale(folder: Path) -> str | None:
    """Why a folder this build wrote earlier must be built again (None: it is current)."""
    missing = missing_files(folder)
    if missing:
        return f"it lacks {', '.join(missing)}"
    try:
        Manifest.load(folder)
    except ContractError as e:
        return str(e)
    return None


def _remove_orphans(models_dir: Path, name: str) -> None:
    """Delete the partial folders of earlier builds of `name` whose process is gone (killed for
    memory, say: it could not clean up)."""
    for partial in models_dir.glob(f".{name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            log.info("removing %s, left by a build that did not finish", partial)
            shutil.rmtree(partial, ignore_errors=True)


def build_model(
    name: str,
    models_dir: Path,
    cache_dir: Path,
    precision: str = "int8",
    source_folder: Path | None = None,
    skip_existing: bool = False,
    progress: bool = True,
    source: ResolvedSource | None = None,
    on_step: Callable[[float], None] | None = None,
) -> BuildSummary | None:
    """Build `models_dir/name`; returns None when it exists and `skip_existing` is set.

    The weights come from `source` when given (e.g. a Hub snapshot), else from `source_folder`,
    else from the catalog. `on_step(fraction)` follows the build's steps (0..1).
    """
    if not MODEL_NAME.match(name):
        raise BuildError(f"invalid model name {name!r}: use letters, digits, '.', '_' or '-'")
    if precision not in PRECISIONS:
        raise BuildError(f"unknown precision {precision!r}: choose {', '.join(PRECISIONS)}")
    target = Path(models_dir) / name
    if target.exists():
        if not skip_existing:
            raise BuildError(f"{target} already exists: delete it first, or pass --skip-existing")
        stale = _stale(target)
        if stale is None:
            return None
        log.warning("rebuilding %s: %s", target, stale)
        shutil.rmtree(target)

    started = time.perf_counter()
    _remove_orphans(Path(models_dir), name)
    partial = Path(models_dir) / f".{name}.partial-{os.getpid()}"
    steps = tqdm(total=7, desc=f"build {name}", unit="step", disable=not progress)

    done = iter(range(1, 8))  # a disabled tqdm counts nothing

    def advance() -> None:
        steps.update()
        if on_step is not None:
            on_step(next(done) / 7)

    try:
        steps.set_postfix_str("fetching weights")
        if source is None:
            source = (
                resolve_local_folder(source_folder)
                if source_folder is not None
                else fetch_catalog_model(name, Path(cache_dir))
            )
        advance()
        steps.set_postfix_str("reading weights")
        weights = source.load_weights()
        dims = weights.dims()
        manifest = build_manifest(
            name, dims, source.tokenizer, source.generation, precision, source.description
        )
        advance()
        partial.mkdir(parents=True)
        weight_format = PRECISIONS[precision]
        encoder_ranges = decoder_ranges = None
        if weight_format.int8_inputs:
            steps.set_postfix_str("calibrating")
            encoder_ranges = _probed_ranges(
                build_encoder(weights, weight_format, probe_ranges=True),
                partial,
                lambda probe: measure_ranges(probe, dims.n_mels),
            )
        advance()
        steps.set_postfix_str("encoder graph")
        encoder = build_encoder(weights, weight_format, input_ranges=encoder_ranges)
        written = _save(encoder, partial / "encoder.onnx")
        del encoder
        advance()
        steps.set_postfix_str("decoder graph")
        if weight_format.int8_inputs:
            decoder_ranges = _probed_ranges(
                build_decoder(weights, weight_format, manifest.alignment_heads, probe_ranges=True),
                partial,
                lambda probe: measure_decoder_ranges(probe, partial / "encoder.onnx", manifest),
            )
        decoder = build_decoder(weights, weight_format, manifest.alignment_heads, decoder_ranges)
        written += _save(decoder, partial / "decoder.onnx")
        del weights, decoder
        shutil.copyfile(source.tokenizer, partial / "tokenizer.json")
        written.append("tokenizer.json")
        advance()
        steps.set_postfix_str("hashing")
        manifest = dataclasses.replace(
            manifest, sha256={f: sha256_of(partial / f) for f in written}
        )
        (partial / "manifest.json").write_text(manifest.to_json())
        advance()
        partial.rename(target)
        advance()
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        steps.close()
    sizes = {p.name: p.stat().st_size for p in sorted(target.iterdir())}
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return BuildSummary(name, target, precision, time.perf_counter() - started, sizes, peak_mb)
