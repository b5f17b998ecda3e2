"""Every deployed Whisper size, ours vs CTranslate2 int8 on the same weights and threads.

small, medium, large-v3, large-v3-turbo and distil-large-v3 at full size with random weights
(the values do not change the time; `benchmarks/size_checkpoints.py` writes them with each
model's real dimensions): encoder ms per 30 s window, decoder ms per step at 1 and 5 rows after a
past of 100, model load time, RSS after load, file sizes; build time and peak build RSS of our
exporter (`python -m app.export build NAME --from hf/`, int8 files, under `/usr/bin/time -v`) and
of CTranslate2's converter (`ct2-transformers-converter --quantization int8`).

Setup, once: `make bench-sizes-setup` (the peer venv `.venv-peer` with faster-whisper's
CTranslate2, plus torch and transformers for writing and converting checkpoints), and
`make test-models` (the multilingual tokenizer). Checkpoints and built models go under --root
(default /work/ckpt, never the repository; large-v3 needs ~3.1 GB hf + 1.6 GB ct2 + ours):

    .venv/bin/python -m benchmarks.model_sizes prepare --sizes large-v3
    .venv/bin/python -m benchmarks.model_sizes measure --sizes large-v3 --rounds 3
    .venv/bin/python -m benchmarks.model_sizes report

Each side runs in its own process (`benchmarks/size_worker.py`, which says how each figure is
taken), one model in memory at a time; a round starts a fresh process per side, sides
alternating (the order rotates each round), and the figures are medians over rounds. Every
measurement records /proc/loadavg at its start and end. `measure` replaces the sizes it ran in
benchmarks/results/model_sizes.json and rewrites model_sizes.md from the whole file, so a size
taken under load can be re-run alone; `--name` names another pair (a CPU kind of its own:
`model_sizes_epyc_bf16` is the AMD EPYC with AVX-512 BF16).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import REPO
from benchmarks.size_checkpoints import SIZES

ROOT = Path("/work/ckpt")
CONVERTER = common.PEER_PYTHON.parent / "ct2-transformers-converter"
BUSY = 1.5  # a figure taken at a 1-min load average at or above this is flagged
SIDES = ("ours", "ct2")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("prepare", "measure", "report"))
    p.add_argument("--sizes", default=",".join(SIZES), help=f"of {','.join(SIZES)}")
    p.add_argument("--root", type=Path, default=ROOT, help="checkpoints and built models")
    p.add_argument("--rebuild", action="store_true", help="prepare: build ours again")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per side")
    p.add_argument("--append", action="store_true", help="add the rounds to a size's earlier ones")
    p.add_argument("--encodes", type=int, default=1, help="timed windows per round (+1 warm-up)")
    p.add_argument("--step-reps", type=int, default=1, help="step samples per round")
    p.add_argument("--past", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--name",
        default="model_sizes",
        help="results file stem under benchmarks/results (one per CPU kind, e.g. "
        "model_sizes_epyc_bf16)",
    )
    return p.parse_args()


FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def cpu() -> str:
    """The CPU's name and which of the instruction sets that matter here it has."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    have = [f for f in FLAGS if f in flags]
    lacks = [f for f in FLAGS if f not in flags]
    return f"{common.machine_line()} ({', '.join(have) or 'none'}; no {', '.join(lacks)})"


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def load1(text: str) -> float:
    return float(text.split()[0])


# ---- prepare ------------------------------------------------------------------------------------


def timed(cmd: list[str], log: Path) -> dict:
    """Run cmd under /usr/bin/time -v: wall seconds, peak RSS (MB), the load around it."""
    before = loadavg()
    with log.open("w") as out:
        subprocess.run(["/usr/bin/time", "-v", *cmd], cwd=REPO, stdout=out, stderr=out, check=True)
    text = log.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", text)
    assert wall is not None, f"no wall time in {log}"
    hours, minutes, seconds = (float(g or 0) for g in wall.groups())
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    assert peak is not None, f"no peak RSS in {log}"
    return {
        "wall_s": 3600 * hours + 60 * minutes + seconds,
        "peak_rss_mb": int(peak.group(1)) / 1024,
        "loadavg": [before, loadavg()],
    }


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def ours_dir(root: Path, size: str) -> Path:
    """The model folder our exporter built under root/size/ours (its one manifest's folder)."""
    found = sorted((root / size / "ours").glob("*/manifest.json"))
    if len(found) != 1:
        raise SystemExit(f"expected one built model under {root / size / 'ours'}, found {found}")
    return found[0].parent


def prepare(size: str, args: argparse.Namespace) -> None:
    base = args.root / size
    hf, ct2, ours = base / "hf", base / "ct2", base / "ours"
    info_path = base / "prepare.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    if not (hf / "tokenizer.json").is_file():
        cmd = [str(common.PEER_PYTHON), "-m", "benchmarks.size_checkpoints", size]
        subprocess.run([*cmd, "--root", str(args.root)], check=True, cwd=REPO)
    if not (ct2 / "model.bin").is_file():
        partial = base / "ct2.partial"
        shutil.rmtree(partial, ignore_errors=True)
        cmd = [str(CONVERTER), "--model", str(hf), "--output_dir", str(partial)]
        cmd += ["--quantization", "int8", "--copy_files", "tokenizer.json"]
        info["ct2_convert"] = timed(cmd, base / "ct2_convert.log")
        partial.rename(ct2)
    if args.rebuild or not list(ours.glob("*/manifest.json")):
        shutil.rmtree(ours, ignore_errors=True)
        cmd = [str(common.OUR_PYTHON), "-m", "app.export", "build", size, "--from", str(hf)]
        cmd += ["--models-dir", str(ours), "--quiet"]
        info["build"] = timed(cmd, base / "build.log")
    info["bytes"] = {
        "hf_fp16": folder_bytes(hf),
        "ct2_int8": (ct2 / "model.bin").stat().st_size,
        "ours_int8": folder_bytes(ours_dir(args.root, size)),
        "ours_files": {
            f.name: f.stat().st_size for f in sorted(ours_dir(args.root, size).iterdir())
        },
    }
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    print(f"{size}: {json.dumps(info)}", file=sys.stderr)


# ---- measure ------------------------------------------------------------------------------------


class Side:
    """A fresh worker process for one side of one size."""

    def __init__(self, kind: str, folder: Path, threads: int) -> None:
        python = common.OUR_PYTHON if kind == "ours" else common.PEER_PYTHON
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [str(python), "-m", "benchmarks.size_worker", kind, str(folder)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, op: str, **kwargs: Any) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        before = loadavg()
        self.process.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died (exit {self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return {**reply, "loadavg": [before, loadavg()]}

    def close(self) -> None:
        self.call("quit")
        self.process.wait(30)


def one_run(kind: str, folder: Path, args: argparse.Namespace) -> dict:
    side = Side(kind, folder, args.threads)
    at = time.strftime("%H:%M", time.gmtime())
    try:
        run: dict = {"load": side.call("load", threads=args.threads)}
        run["encode"] = side.call("encode", reps=args.encodes + 1)
        run["encode"]["ms"] = run["encode"]["ms"][1:]  # the first window warms up
        for rows in (1, 5):
            run[f"step{rows}"] = side.call("step", rows=rows, past=args.past, reps=args.step_reps)
        run["end"] = side.call("rss")
    finally:
        side.close()
    run["at"] = at
    print(f"  {kind}: {summary_line(run)}", file=sys.stderr)
    return run


def summary_line(run: dict) -> str:
    return (
        f"load {run['load']['load_s']:.1f} s, rss {run['load']['rss_mb']:.0f} MB, "
        f"encoder {statistics.median(run['encode']['ms']):.0f} ms, "
        f"step {statistics.median(run['step1']['ms']):.1f} / "
        f"{statistics.median(run['step5']['ms']):.1f} ms, load avg {run['load']['loadavg'][0]}"
    )


def measure(size: str, args: argparse.Namespace, results: dict[str, dict]) -> None:
    """Rounds of both sides for one size, results[size] saved after each round; with --append
    the rounds are added to the size's earlier ones (same CPU only)."""
    earlier = results.get(size) if args.append else None
    if earlier and earlier["cpu"] != cpu():
        raise SystemExit(f"{size} was measured on {earlier['cpu']}, not {cpu()}: no --append")
    runs: dict[str, list[dict]] = earlier["runs"] if earlier else {k: [] for k in SIDES}
    folders = {"ours": ours_dir(args.root, size), "ct2": args.root / size / "ct2"}
    first = len(runs["ours"])
    for r in range(first, first + args.rounds):
        print(f"{size} round {r + 1}", file=sys.stderr)
        for kind in common.rotate(list(SIDES), r):
            runs[kind].append(one_run(kind, folders[kind], args))
        results[size] = {
            "size": size,
            "hub_id": SIZES[size].hub_id,
            "dims": SIZES[size].__dict__,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu(),
            "threads": args.threads,
            "past": args.past,
            "prepare": json.loads((args.root / size / "prepare.json").read_text()),
            "runs": runs,
        }
        json_out(args).write_text(json.dumps(results, indent=1) + "\n")


# ---- report -------------------------------------------------------------------------------------


def med(runs: list[dict], key: str, field: str = "ms") -> float:
    """Median over every sample of every run."""
    values = [v for r in runs for v in (r[key][field] if field == "ms" else [r[key][field]])]
    return statistics.median(values)


def max_load(result: dict) -> float:
    loads = [load1(t) for side in result["runs"].values() for r in side for t in loads_of(r)]
    return max(loads)


def loads_of(run: dict) -> list[str]:
    return [t for part in run.values() if isinstance(part, dict) for t in part["loadavg"]]


def flag(result: dict) -> str:
    return f"{max_load(result):.2f}" + (" **busy**" if max_load(result) >= BUSY else "")


def ratio(ours: float, theirs: float) -> str:
    """ours / theirs; none when a difference of two timings came out <= 0 (noise won)."""
    return f"{ours / theirs:.2f}×" if theirs > 0 else "n/a"


def speed_rows(results: list[dict]) -> list[list[str]]:
    rows = []
    for res in results:
        o, t = res["runs"]["ours"], res["runs"]["ct2"]
        cells = [res["size"], f"{len(o)} / {len(t)}"]
        for key, fmt in (("encode", "{:.0f}"), ("step1", "{:.1f}"), ("step5", "{:.1f}")):
            a, b = med(o, key), med(t, key)
            cells += [fmt.format(a), fmt.format(b), ratio(a, b)]
        rows.append([*cells, flag(res)])
    return rows


def memory_rows(results: list[dict]) -> list[list[str]]:
    rows = []
    for res in results:
        o, t, p = res["runs"]["ours"], res["runs"]["ct2"], res["prepare"]
        gb = {k: v / 1e9 for k, v in p["bytes"].items() if isinstance(v, int)}
        build, convert = p.get("build"), p.get("ct2_convert")
        rows.append(
            [
                res["size"],
                f"{med(o, 'load', 'load_s'):.1f} / {med(t, 'load', 'load_s'):.1f}",
                pair(o, t, "load", "rss_mb"),
                pair(o, t, "end", "peak_rss_mb"),
                f"{gb['ours_int8']:.2f} / {gb['ct2_int8']:.2f} ({gb['hf_fp16']:.2f})",
                build_cell(build),
                build_cell(convert),
            ]
        )
    return rows


def pair(ours: list[dict], theirs: list[dict], key: str, field: str) -> str:
    """Medians of a memory figure in GB, ours / theirs."""
    return f"{med(ours, key, field) / 1e3:.2f} / {med(theirs, key, field) / 1e3:.2f}"


def first_load(text: str) -> str:
    return text.split()[0]


def build_cell(b: dict | None) -> str:
    if b is None:
        return "—"
    busy = " **busy**" if max(load1(t) for t in b["loadavg"]) >= BUSY else ""
    load = first_load(b["loadavg"][0])
    return f"{b['wall_s']:.0f} s, {b['peak_rss_mb'] / 1e3:.1f} GB (load {load}){busy}"


def load_lines(results: list[dict]) -> list[str]:
    lines = []
    for res in results:
        lines.append(f"- {res['size']} ({res['when']}):")
        for kind, runs in res["runs"].items():
            for i, run in enumerate(runs):
                spans = ", ".join(
                    f"{part} {first_load(run[part]['loadavg'][0])}"
                    f"–{first_load(run[part]['loadavg'][1])}"
                    for part in ("load", "encode", "step1", "step5")
                )
                at = f" at {run['at']} UTC" if "at" in run else ""
                lines.append(f"  - {kind} round {i + 1}{at}: {spans}")
    return lines


def report(results: dict[str, dict]) -> list[str]:
    ordered = [results[s] for s in SIZES if s in results]
    first = ordered[0] if ordered else {}
    cpus = sorted({r["cpu"] for r in ordered})
    lines = [
        "# Every Whisper size: ours vs CTranslate2 int8 (random full-size weights)",
        "",
        "`.venv/bin/python -m benchmarks.model_sizes measure` (see its docstring and "
        "`benchmarks/size_worker.py` for how each figure is taken); "
        f"{' / '.join(cpus)}: without avx512_bf16 our `auto` precision is f32 with activation "
        f"quantization; {first.get('threads', 2)} threads each side. Ours: int8 "
        "files from `python -m app.export build NAME --from hf/`, OpenVINO (its own API), service "
        "defaults. CTranslate2: the same fp16 checkpoint converted with `--quantization int8`, "
        f"`compute_type=int8`. Decoder steps at past {first.get('past', 100)}: ours one "
        "decode call (rows on one window, as beams); CTranslate2 through `generate` "
        "(greedy / beam 5, end-of-text suppressed), the difference of two lengths: the mean "
        "step over pasts 75–124 (one difference per round: with a cheap step and a busy "
        "machine it can come out ≤ 0, then the ratio is n/a). `rounds` = fresh processes per "
        "side (ours / CT2), sides alternated, the order rotating; each figure is the median "
        "over every sample of every round (encoder: the windows after a warm-up one; ours' "
        "step: means of 20 calls). The machine is "
        f"shared: **busy** = a 1-min load average ≥ {BUSY} during the size's measurements "
        "(figures of both sides are then slower and much noisier). Load time: ours compiles "
        "the encoder and decoder sessions (no OpenVINO cache, the service's default); "
        "CTranslate2 reads model.bin (after the first round from the page cache). RSS after "
        "load: VmRSS of the worker process, Python and the runtime included.",
        "",
        *common.table(
            [
                "size",
                "rounds",
                "encoder ms ours",
                "CT2",
                "ratio",
                "step 1 row ms ours",
                "CT2",
                "ratio",
                "step 5 rows ms ours",
                "CT2",
                "ratio",
                "max load",
            ],
            speed_rows(ordered),
        ),
        "",
        "Load, memory and files (ours / CTranslate2):",
        "",
        *common.table(
            [
                "size",
                "load s",
                "RSS after load GB",
                "peak RSS after the runs GB",
                "files GB (hf fp16)",
                "our build: time, peak RSS",
                "CT2 conversion: time, peak RSS",
            ],
            memory_rows(ordered),
        ),
        "",
        "Load average (1 min) at the start and end of each measurement:",
        "",
        *load_lines(ordered),
    ]
    return lines


def json_out(args: argparse.Namespace) -> Path:
    return common.RESULTS / f"{args.name}.json"


def main() -> None:
    args = parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown size(s) {unknown}; known: {', '.join(SIZES)}")
    results = json.loads(json_out(args).read_text()) if json_out(args).is_file() else {}
    if args.command == "prepare":
        for size in sizes:
            prepare(size, args)
        return
    if args.command == "measure":
        for size in sizes:
            measure(size, args, results)
    common.write(common.RESULTS / f"{args.name}.md", report(results))


if __name__ == "__main__":
    main()
