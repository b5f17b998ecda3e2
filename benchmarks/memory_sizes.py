"""Where a loaded model's memory goes: RSS per graph and per model size, weights embedded in the
.onnx files vs in external data files (which `WhisperSessions` drops once packed).

For each size, each layout runs in a fresh process (the service's malloc settings, the service's
`WhisperSessions.load` on the OpenVINO EP, 2 threads): VmRSS (with its anonymous and file-backed
parts) after load, after the first encoder window, after a first decoder call and an aligner call
(the weights are packed on a graph's first run), and after a second window, whose time is the
encoder figure. Layouts alternate, `--rounds` times. The external layout is the same graphs saved
with `onnx.save(..., save_as_external_data=True)` (the same weight bytes) into
.cache/bench/external/<size>. Folders: models/<size>, else /work/ckpt/<size>/ours/<name> (random
full-size weights, benchmarks/size_checkpoints.py). `--stage` loads one graph alone instead.

    .venv/bin/python benchmarks/memory_sizes.py --sizes tiny.en,small,large-v3-turbo

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.runtime.memory import malloc_environment  # noqa: E402
from benchmarks import common  # noqa: E402

CKPT = Path("/work/ckpt")
EXTERNAL = common.CACHE / "external"
STAGES = ("encoder", "decoder", "aligner")
LAYOUTS = ("embedded", "external")


def folder_for(size: str) -> Path:
    local = REPO / "models" / size
    if (local / "manifest.json").is_file():
        return local
    found = sorted((CKPT / size / "ours").glob("*/manifest.json"))
    if not found:
        raise SystemExit(f"no model folder for {size} in models/ or {CKPT}/{size}/ours")
    return found[0].parent


def external_copy(folder: Path, size: str) -> Path:
    """The same graphs with their weights in `<graph>.onnx.data` files (built once)."""
    import onnx

    out = EXTERNAL / size
    if all((out / f"{s}.onnx.data").is_file() for s in STAGES):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in ("manifest.json", "tokenizer.json"):
        (out / name).write_bytes((folder / name).read_bytes())
    for stage in STAGES:
        model = onnx.load(folder / f"{stage}.onnx")
        onnx.save(
            model,
            out / f"{stage}.onnx",
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{stage}.onnx.data",
            size_threshold=1024,
        )
    return out


def memory() -> dict[str, float]:
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            values[key] = int(value.split()[0]) / 1024
    keys = {"rss": "VmRSS", "anon": "RssAnon", "file": "RssFile", "peak": "VmHWM"}
    return {name: values[key] for name, key in keys.items()}


def worker(folder: Path, threads: int) -> dict:
    """In this process: load the model as the service does and run each graph (see above)."""
    import numpy as np

    from app.runtime.memory import tune_malloc
    from app.runtime.sessions import RuntimeOptions, WhisperSessions

    tune_malloc()
    marks: dict[str, dict] = {"start": memory()}
    started = time.perf_counter()
    s = WhisperSessions.load(folder, RuntimeOptions(threads=threads))
    load_s = time.perf_counter() - started
    marks["load"] = memory()
    d = s.manifest.dims
    rng = np.random.default_rng(0)
    features = rng.standard_normal((1, d.n_mels, 3000)).astype(np.float32)
    started = time.perf_counter()
    cross = s.encode(features)
    first_s = time.perf_counter() - started
    marks["encoder run"] = memory()
    ids = np.array([[50257, 100, 200, 300]], np.int64)  # any ids below every vocabulary's size
    positions = np.arange(4, dtype=np.int64)[None]
    s.decode(ids, positions, np.ones((1, 4), np.int64), s.empty_past(), cross)
    marks["decoder run"] = memory()
    s.align(ids, np.array([[100, 200, 300, 400]], np.int64), cross)
    marks["aligner run"] = memory()
    started = time.perf_counter()
    s.encode(features)
    second_s = time.perf_counter() - started
    marks["second window"] = memory()
    return {"load_s": load_s, "encoder_first_s": first_s, "encoder_s": second_s, "marks": marks}


def run_worker(folder: Path, threads: int) -> dict:
    env = {**os.environ, **malloc_environment()}
    load_before = common.load1()
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(folder), "--threads", str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["loads"] = [load_before, common.load1()]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny.en,base,small,large-v3-turbo")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    common.add_args(p)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads)))
        return
    load_before = common.start_load(args)
    results: dict[str, dict[str, list[dict]]] = {}
    for size in args.sizes.split(","):
        folder = folder_for(size)
        folders = {"embedded": folder, "external": external_copy(folder, size)}
        for r in range(args.rounds):
            for layout in common.rotate(list(LAYOUTS), r):
                print(f"{size} {layout} round {r + 1}", file=sys.stderr)
                result = run_worker(folders[layout], args.threads)
                results.setdefault(size, {}).setdefault(layout, []).append(result)
    (args.out_dir / "memory_sizes.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(args, load_before, results)


def gb(x: float) -> str:
    return f"{x / 1024:.2f}"


def write_table(args: argparse.Namespace, load_before: float, results: dict) -> None:
    head = ["size", "layout", "int8 files GB", "load s", "RSS after load GB (anon + file)"]
    head += [f"after {m} GB" for m in ("encoder run", "decoder run", "aligner run")]
    head += ["after a second window GB (anon + file)", "peak GB", "encoder s per window", "load"]
    rows = []
    for size, layouts in results.items():
        files = sum(f.stat().st_size for f in folder_for(size).glob("*.onnx")) / 2**30
        for layout, runs in layouts.items():

            def median(mark: str, key: str, runs: list = runs) -> float:
                return statistics.median(r["marks"][mark][key] for r in runs)

            loads = [x for r in runs for x in r["loads"]]
            rows.append(
                [
                    size,
                    layout,
                    f"{files:.2f}",
                    f"{statistics.median(r['load_s'] for r in runs):.1f}",
                    f"{gb(median('load', 'rss'))} ({gb(median('load', 'anon'))} + "
                    f"{gb(median('load', 'file'))})",
                    gb(median("encoder run", "rss")),
                    gb(median("decoder run", "rss")),
                    gb(median("aligner run", "rss")),
                    f"{gb(median('second window', 'rss'))} ({gb(median('second window', 'anon'))}"
                    f" + {gb(median('second window', 'file'))})",
                    gb(median("second window", "peak")),
                    f"{statistics.median(r['encoder_s'] for r in runs):.2f}",
                    f"{min(loads):.1f}–{max(loads):.1f}",
                ]
            )
    lines = common.header(
        "Memory per model size: weights embedded vs external data files",
        load_before,
        [
            f"{args.rounds} round(s) per layout, each a fresh process; figures are medians. "
            "CPU: AMD EPYC, AVX2 only (no AVX-512, no VNNI): f32 compute, int8 weights. "
            "RSS = VmRSS (anonymous + file-backed pages); peak = VmHWM.",
        ],
    )
    lines += ["", *common.table(head, rows)]
    common.write(args.out_dir / "memory_sizes.md", lines)


if __name__ == "__main__":
    main()
