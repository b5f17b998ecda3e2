"""Where a loaded model's memory goes, ours vs CTranslate2 int8, per model size.

Each side runs in a fresh process, sides alternated `--rounds` times, 2 threads each. Ours: the
service's malloc settings and `WhisperSessions.load` on the OpenVINO EP; VmRSS (with its
anonymous and file-backed parts) after load, after the first encoder window, after a first
decoder call, after word timing's call (`align`, on the decoder's session; the weights are
packed on a graph's first run) and after a second window, whose time is the encoder figure.
CTranslate2 (`ctranslate2.models.Whisper`, compute_type int8, in `.venv-peer`): after load,
`encode`, a short greedy `generate`, `align` (its word timing) and a second `encode`.
Folders: ours models/<size>, else <--ckpt>/<size>/ours/<name> (random full-size weights,
benchmarks/size_checkpoints.py); CTranslate2 <ckpt>/<size>/ct2, else the catalog's own
CTranslate2 files (`common.peer_model_dir`, tiny.en and base).

    .venv/bin/python -m benchmarks.memory_sizes --sizes base,small,large-v3-turbo

Writes benchmarks/results/memory_sizes.md (+ .json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO

CKPT = Path("/work/ckpt")
SIDES = ("ours", "ct2")
MARKS = ("load", "encoder run", "decoder run", "word timing run", "second window")
PROMPT = [50258, 50259, 50360, 50364]  # a multilingual sot sequence and <|notimestamps|>
TEXT = [100, 200, 300, 400]  # any ids below every vocabulary's size


def ours_folder(size: str, ckpt: Path) -> Path:
    local = REPO / "models" / size
    if (local / "manifest.json").is_file():
        return local
    found = sorted((ckpt / size / "ours").glob("*/manifest.json"))
    if not found:
        raise SystemExit(f"no model folder for {size} in models/ or {ckpt}/{size}/ours")
    return found[0].parent


def ct2_folder(size: str, ckpt: Path) -> Path:
    folder = ckpt / size / "ct2"
    if (folder / "model.bin").is_file():
        return folder
    from benchmarks import common

    return common.peer_model_dir(size)


def memory() -> dict[str, float]:
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            values[key] = int(value.split()[0]) / 1024
    keys = {"rss": "VmRSS", "anon": "RssAnon", "file": "RssFile", "peak": "VmHWM"}
    return {name: values[key] for name, key in keys.items()}


def ours_worker(folder: Path, threads: int) -> dict:
    """In this process: load the model as the service does and run each graph (see above)."""
    import numpy as np

    from app.runtime.memory import tune_malloc
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions

    tune_malloc()
    marks: dict[str, dict] = {"start": memory()}
    started = time.perf_counter()
    s = WhisperSessions.load(folder, RuntimeOptions(threads=threads))
    load_s = time.perf_counter() - started
    marks["load"] = memory()
    d = s.manifest.dims
    features = np.random.default_rng(0).standard_normal((1, d.n_mels, 3000)).astype(np.float32)
    cross = s.encode(features)
    marks["encoder run"] = memory()
    ids = np.array([[*PROMPT[:1], *TEXT]], np.int64)
    positions, mask = np.arange(5, dtype=np.int64)[None], np.ones((1, 5), np.int64)
    s.decode(ids, positions, mask, s.empty_past(), cross)
    marks["decoder run"] = memory()
    s.align(ids, np.array([[*TEXT, 0]], np.int64), cross)
    marks["word timing run"] = memory()
    started = time.perf_counter()
    s.encode(features)
    second_s = time.perf_counter() - started
    marks["second window"] = memory()
    return {"load_s": load_s, "encoder_s": second_s, "marks": marks}


def ct2_worker(folder: Path, threads: int) -> dict:
    """The same marks for CTranslate2 int8 (run with the peer venv's Python)."""
    import ctranslate2
    import numpy as np

    marks: dict[str, dict] = {"start": memory()}
    started = time.perf_counter()
    model = ctranslate2.models.Whisper(
        str(folder), device="cpu", compute_type="int8", intra_threads=threads
    )
    load_s = time.perf_counter() - started
    marks["load"] = memory()
    rng = np.random.default_rng(0)
    features = ctranslate2.StorageView.from_array(
        rng.standard_normal((1, model.n_mels, 3000)).astype(np.float32)
    )
    encoded = model.encode(features, to_cpu=True)
    marks["encoder run"] = memory()
    prompt = PROMPT if model.is_multilingual else [50257, 50362]
    model.generate(encoded, [prompt], max_length=len(prompt) + 8)
    marks["decoder run"] = memory()
    model.align(features, prompt[:-1], [TEXT], 1500)
    marks["word timing run"] = memory()
    started = time.perf_counter()
    model.encode(features, to_cpu=True)
    second_s = time.perf_counter() - started
    marks["second window"] = memory()
    return {"load_s": load_s, "encoder_s": second_s, "marks": marks}


def run_worker(side: str, folder: Path, threads: int) -> dict:
    from app.runtime.memory import malloc_environment
    from benchmarks import common

    env = {**os.environ, **malloc_environment()} if side == "ours" else dict(os.environ)
    python = sys.executable if side == "ours" else str(common.PEER_PYTHON)
    load_before = common.load1()
    cmd = [python, __file__, "--worker", side, str(folder), "--threads", str(threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["loads"] = [load_before, common.load1()]
    return result


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:  # the peer venv has no repo dependencies: parse by hand
        side, folder, threads = sys.argv[2], Path(sys.argv[3]), int(sys.argv[5])
        work = ours_worker if side == "ours" else ct2_worker
        print(json.dumps(work(folder, threads)))
        return
    from benchmarks import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="base,small,large-v3-turbo")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--ckpt", type=Path, default=CKPT, help="random-weight checkpoints' root")
    common.add_args(p)
    args = p.parse_args()
    load_before = common.start_load(args)
    results: dict[str, dict[str, list[dict]]] = {}
    for size in args.sizes.split(","):
        folders = {"ours": ours_folder(size, args.ckpt), "ct2": ct2_folder(size, CKPT)}
        for r in range(args.rounds):
            for side in common.rotate(list(SIDES), r):
                print(f"{size} {side} round {r + 1}", file=sys.stderr)
                result = run_worker(side, folders[side], args.threads)
                result["files_gb"] = (
                    sum(f.stat().st_size for f in folders[side].iterdir() if f.is_file()) / 2**30
                )
                results.setdefault(size, {}).setdefault(side, []).append(result)
    (args.out_dir / "memory_sizes.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(args, load_before, results)


def gb(x: float) -> str:
    return f"{x / 1024:.2f}"


def write_table(args: argparse.Namespace, load_before: float, results: dict) -> None:
    from benchmarks import common

    head = ["size", "side", "files GB", "load s", "RSS after load GB (anon + file)"]
    head += [f"after {m} GB" for m in MARKS[1:-1]]
    head += ["after a second window GB (anon + file)", "peak GB", "÷ CT2 after runs"]
    head += ["encoder s per window", "load"]
    rows = []
    for size, sides in results.items():
        after = {
            side: statistics.median(r["marks"]["second window"]["rss"] for r in runs)
            for side, runs in sides.items()
        }
        for side, runs in sides.items():

            def median(mark: str, key: str, runs: list = runs) -> float:
                return statistics.median(r["marks"][mark][key] for r in runs)

            loads = [x for r in runs for x in r["loads"]]
            ratio = after[side] / after["ct2"] if "ct2" in after else float("nan")
            rows.append(
                [
                    size,
                    side,
                    f"{runs[0]['files_gb']:.2f}",
                    f"{statistics.median(r['load_s'] for r in runs):.1f}",
                    f"{gb(median('load', 'rss'))} ({gb(median('load', 'anon'))} + "
                    f"{gb(median('load', 'file'))})",
                    *(gb(median(mark, "rss")) for mark in MARKS[1:-1]),
                    f"{gb(median('second window', 'rss'))} ({gb(median('second window', 'anon'))}"
                    f" + {gb(median('second window', 'file'))})",
                    gb(median("second window", "peak")),
                    f"{ratio:.2f}×",
                    f"{statistics.median(r['encoder_s'] for r in runs):.2f}",
                    f"{min(loads):.1f}–{max(loads):.1f}",
                ]
            )
    lines = common.header(
        "Memory per model size: ours vs CTranslate2 int8",
        load_before,
        [
            f"{args.rounds} round(s) per side, each a fresh process, sides alternated; figures "
            "are medians. Ours: int8 weights in `<graph>.onnx.data` files, f32 compute on this "
            "CPU; word timing on the decoder's session. RSS = VmRSS (anonymous + file-backed "
            "pages); peak = VmHWM; the ratio compares RSS after the runs (a second window).",
        ],
    )
    lines += ["", *common.table(head, rows)]
    common.write(args.out_dir / "memory_sizes.md", lines)


if __name__ == "__main__":
    main()
