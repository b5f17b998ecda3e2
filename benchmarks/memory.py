"""Memory: peak RSS of one CLI transcription and of the running server, ours vs faster-whisper.

CLI: `python -m app transcribe FILE --model M --threads 2 --ep EP` (fp32 files from models/, fp16
files from .cache/bench/models-fp16/), run as a child process; its peak RSS is the kernel's
`ru_maxrss` for that child (os.wait4); bf16 rows add `--precision bf16`. faster-whisper's row
runs benchmarks/peer_worker.py once in .venv-peer (WhisperModel + transcribe, the same weights).

Server: `uvicorn --factory app.main:create_app` with STT_MODELS=<model>, STT_THREADS=2,
STT_WORKERS=1, the glibc malloc settings of `make run` in the environment (app/runtime/memory.py),
STT_PRECISION=f32 or bf16 as the row says (the server's default, auto, is bf16
on this CPU); RSS (VmRSS) and peak RSS (VmHWM) of the server process when /health first answers
(models loaded and warmed up) and every 10 requests up to `--requests` sequential jfk requests
(default 100, json, server-default decoding), and once more after one request of the 60 s
clip (3 windows with prompts: larger decoder shapes). Next to it, faster-whisper's warm
process: after loading, after the same number of jfk transcriptions and after the 60 s clip.

    .venv/bin/python -m benchmarks.memory            # both models, ~15 min
    .venv/bin/python -m benchmarks.memory --quick    # tiny.en, OV fp32 + fw int8, 20 requests

Writes benchmarks/results/memory.md and memory_server.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.runtime.memory import malloc_environment
from benchmarks import common
from benchmarks.api_latency import transcribe
from benchmarks.common import CONFIGS, REPO, Config
from benchmarks.server import start_server

CLI_CLIPS = {"jfk": common.JFK, "earnings60": common.EARNINGS, "long10m": common.LONG}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--cli-configs", default="ov-int8-bf16,ov-fp16-bf16,ov-fp32,fw-int8,fw-fp32")
    p.add_argument("--cli-clips", default="jfk,earnings60", help=f"of {','.join(CLI_CLIPS)}")
    p.add_argument(
        "--server-configs",
        default="ov-int8-bf16,ov-fp16-bf16,fw-int8",
        help="ours: a server per configuration; fw-*: faster-whisper's warm process alike",
    )
    p.add_argument("--requests", type=int, default=100, help="jfk requests per server")
    p.add_argument("--beam", type=int, default=5, help="CLI beam size (default 5)")
    p.add_argument("--quick", action="store_true")
    common.add_args(p)
    args = p.parse_args()
    if args.quick:
        args.models, args.cli_configs, args.cli_clips = "tiny.en", "ov-int8-bf16,fw-int8", "jfk"
        args.server_configs = "ov-int8-bf16,fw-int8"
        args.requests = 20 if args.requests == 100 else args.requests
    return args


def run_child(cmd: list[str], stdin_text: str | None, threads: int) -> tuple[int, float, float]:
    """(exit code, peak RSS MB, wall s) of one child process."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            text=True,
            stderr=err,
            stdin=subprocess.PIPE if stdin_text else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        if stdin_text:
            assert p.stdin is not None
            p.stdin.write(stdin_text)
            p.stdin.close()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            err.seek(0)
            print(err.read().decode()[-2000:], file=sys.stderr)
    return p.returncode, usage.ru_maxrss / 1024, wall


def cli_peak(model: str, config: Config, clip: Path, args: argparse.Namespace) -> dict:
    lines = None
    if config.kind == "peer":
        cmd = [str(common.PEER_PYTHON), "-m", "benchmarks.peer_worker"]
        load = {
            "model_dir": str(common.peer_model_dir(model)),
            "compute_type": config.compute_type,
            "threads": args.threads,
        }
        how = "peer_worker.py once"
    else:
        cmd = [
            str(common.OUR_PYTHON),
            "-m",
            "app",
            "transcribe",
            str(clip),
            "--model",
            model,
            "--models-dir",
            str(common.models_dir_for(model, config.files)),
            "--threads",
            str(args.threads),
            "--ep",
            config.ep,
            "--beam-size",
            str(args.beam),
            "--language",
            "en",
            *(["--precision", config.precision] if config.precision else []),
        ]
        load = None
        how = "python -m app transcribe"
    if load is not None:
        lines = "\n".join(
            json.dumps(x)
            for x in (
                {"op": "load", **load},
                {"op": "transcribe", "path": str(clip), "beam_size": args.beam},
                {"op": "quit"},
            )
        )
    rc, peak, wall = run_child(cmd, lines, args.threads)
    return {"rc": rc, "peak_mb": peak, "wall_s": wall, "how": how}


def server_curve(model: str, config: Config, args: argparse.Namespace) -> dict:
    """RSS samples [(requests done, rss MB, peak MB)] of a server or a peer process."""
    audio = common.JFK.read_bytes()
    samples = []
    if config.kind == "peer":
        worker = common.Worker(model, config, args.threads)
        try:
            pid = worker.process.pid
            samples.append((0, *common.rss_mb(pid)))
            for i in range(1, args.requests + 1):
                worker.transcribe(common.JFK, 5)
                if i % 10 == 0 or i == args.requests:
                    samples.append((i, *common.rss_mb(pid)))
            worker.transcribe(common.EARNINGS, 5)
            after_long = common.rss_mb(pid)
        finally:
            worker.close()
        return {
            "samples": samples,
            "after_long": after_long,
            "what": "faster-whisper warm process, jfk beam 5",
        }
    # the server's default precision is "auto" (bf16 on this CPU): name it for every row
    precision = {"STT_PRECISION": config.precision or "f32"} if config.ep == "openvino" else {}
    # glibc malloc set in the environment, as `make run` and the Docker image start the server
    server = start_server(
        model,
        common.models_dir_for(model, config.files),
        1,
        args.threads,
        config.ep,
        extra_env={**precision, **malloc_environment()},
    )
    try:
        assert server.process is not None
        pid = server.process.pid
        samples.append((0, *common.rss_mb(pid)))
        with httpx.Client(timeout=600) as client:
            for i in range(1, args.requests + 1):
                transcribe(client, server.url, audio, model)
                if i % 10 == 0 or i == args.requests:
                    samples.append((i, *common.rss_mb(pid)))
            # then one long request: 3 windows, prompts of ~100 tokens (larger prefill shapes)
            transcribe(client, server.url, common.EARNINGS.read_bytes(), model)
            after_long = common.rss_mb(pid)
    finally:
        server.stop()
    return {"samples": samples, "after_long": after_long, "what": "uvicorn server, jfk requests"}


def plot(curves: dict[tuple[str, str], dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(m for m, _ in curves))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for (m, key), curve in curves.items():
            if m != model:
                continue
            xs = [s[0] for s in curve["samples"]]
            style = "--" if CONFIGS[key].kind == "peer" else "-"
            ax.plot(
                xs,
                [s[1] for s in curve["samples"]],
                style,
                marker="o",
                ms=3,
                label=f"{CONFIGS[key].label} RSS",
            )
        target = {"tiny.en": 500, "base": 700}.get(model)
        if target:
            ax.axhline(target, color="red", lw=0.8, ls=":", label=f"target {target} MB")
        ax.set_title(f"{model}: RSS vs requests served")
        ax.set_xlabel("jfk requests")
        ax.set_ylabel("MB")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    models = args.models.split(",")
    cli_configs = common.parse_configs(args.cli_configs)
    server_configs = common.parse_configs(args.server_configs)
    clips = [c for c in args.cli_clips.split(",") if c]
    for model in models:
        common.peer_model_dir(model)
        common.prepare_models(model, [*cli_configs, *server_configs])
    if "long10m" in clips:
        common.long_clip()
    load_before = common.start_load(args)
    started = time.time()

    cli_rows = []
    for model in models:
        for clip in clips:
            for config in cli_configs:
                r = cli_peak(model, config, CLI_CLIPS[clip], args)
                print(f"[{model}] CLI {clip} {config.key}: {r['peak_mb']:.0f} MB", file=sys.stderr)
                cli_rows.append(
                    [
                        model,
                        clip,
                        config.label,
                        r["how"],
                        f"{r['peak_mb']:.0f}" if r["rc"] == 0 else f"failed ({r['rc']})",
                        f"{r['wall_s']:.1f}",
                    ]
                )
    curves: dict[tuple[str, str], dict] = {}
    for model in models:
        for config in server_configs:
            curves[(model, config.key)] = server_curve(model, config, args)
            last = curves[(model, config.key)]["samples"][-1]
            print(
                f"[{model}] server {config.key}: {last[1]:.0f} MB (peak {last[2]:.0f})",
                file=sys.stderr,
            )

    lines = common.header(
        "Memory: peak RSS, ours vs faster-whisper",
        load_before,
        [
            f"{args.threads} threads. CLI: one process per row, load + one transcription (beam "
            f"{args.beam}, English), peak RSS = ru_maxrss of the child. Server: STT_WORKERS=1, "
            f"{args.requests} sequential jfk requests; RSS = VmRSS, peak = VmHWM of the server "
            "process. Targets (issue 6): server with tiny.en ≤ 500 MB, with base ≤ 700 MB.",
        ],
    )
    lines += ["", "## CLI, peak RSS (MB)", ""]
    lines += common.table(["model", "clip", "system", "run as", "peak RSS MB", "wall s"], cli_rows)
    lines += ["", "## Server (ours) and faster-whisper's warm process (MB)", ""]
    rows = []
    for (model, key), curve in curves.items():
        first, last = curve["samples"][0], curve["samples"][-1]
        target = {"tiny.en": 500, "base": 700}.get(model)
        verdict = "-"
        if CONFIGS[key].kind == "ours" and target:
            verdict = f"{last[2] / target:.2f}× target ({'met' if last[2] <= target else 'missed'})"
        rows.append(
            [
                model,
                CONFIGS[key].label,
                curve["what"],
                f"{first[1]:.0f}",
                f"{first[2]:.0f}",
                last[0],
                f"{last[1]:.0f}",
                f"{last[2]:.0f}",
                verdict,
                f"{curve['after_long'][0]:.0f} / {curve['after_long'][1]:.0f}",
            ]
        )
    lines += common.table(
        [
            "model",
            "system",
            "process",
            "RSS after load",
            "peak after load",
            "requests",
            "RSS after",
            "peak after",
            "peak vs target",
            "then one 60 s request: RSS / peak",
        ],
        rows,
    )
    lines += ["", f"Wall time: {(time.time() - started) / 60:.1f} min."]
    if curves:
        path = args.out_dir / ("memory_server_quick.png" if args.quick else "memory_server.png")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        plot(curves, path)
        lines += ["", f"![{path.stem}]({path.name})"]
    common.write(args.out_dir / ("memory_quick.md" if args.quick else "memory.md"), lines)


if __name__ == "__main__":
    main()
