#!/bin/sh
# Container entry point: normalise the STT_* settings, check the baked models, then exec the command.
set -eu

# The MODELS build argument may be a space list; the service reads a comma list.
STT_MODELS=$(printf '%s' "${STT_MODELS:-}" | tr -s ' ,' ',,' | sed 's/^,//; s/,$//')
export STT_MODELS

# uvicorn reads UVICORN_HOST / UVICORN_PORT; the service's own names are STT_HOST / STT_PORT.
export UVICORN_HOST="${UVICORN_HOST:-${STT_HOST:-0.0.0.0}}"
export UVICORN_PORT="${UVICORN_PORT:-${STT_PORT:-8000}}"

if [ "${1:-}" = "uvicorn" ]; then
    models_dir="${STT_MODELS_DIR:-/models}"
    for m in $(printf '%s' "$STT_MODELS" | tr ',' ' '); do
        # a Hub repository id org/name is built in the folder org--name
        folder=$(printf '%s' "$m" | sed 's#/#--#')
        if [ ! -f "$models_dir/$folder/manifest.json" ]; then
            case "$(printf '%s' "${STT_MODEL_DOWNLOADS:-}" | tr '[:upper:]' '[:lower:]')" in
                1 | true | yes | on | t | y)
                    echo "stt: model '$m' (STT_MODELS) is not built yet: the service fetches" \
                        "and builds it at start (STT_MODEL_DOWNLOADS)" >&2
                    continue ;;
            esac
            baked=$(cd "$models_dir" 2>/dev/null && for f in */manifest.json; do
                [ -f "$f" ] && printf '%s ' "${f%/manifest.json}"; done; true)
            echo "stt: model '$m' (STT_MODELS) is not in $models_dir;" \
                "models there: ${baked:-none}" >&2
            echo "stt: rebuild with --build-arg MODELS=\"$m\", mount a models folder at" \
                "$models_dir, or set STT_MODEL_DOWNLOADS=1 to fetch it at start" >&2
            # No exit: the server starts and /health answers 503 with the reason (the container
            # turns unhealthy) rather than a restart policy looping on the same error.
        fi
    done
    if [ -n "${STT_OV_CACHE_DIR:-}" ]; then
        mkdir -p "$STT_OV_CACHE_DIR" 2>/dev/null || true
        if [ ! -w "$STT_OV_CACHE_DIR" ]; then
            echo "stt: warning: STT_OV_CACHE_DIR=$STT_OV_CACHE_DIR is not writable by uid" \
                "$(id -u); compiled models will not be cached" >&2
        fi
    fi
fi

exec "$@"
