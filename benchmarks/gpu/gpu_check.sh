#!/bin/sh
# The GPU check on a machine without network (docs/GPU_CHECK.md); `make gpu-check` runs this, and it
# runs as `sh benchmarks/gpu/gpu_check.sh [check flags]` where make is not installed.
#
# 1. Install exactly the wheels `make gpu-wheels` put in $GPU_WHEELS into a throwaway directory
#    (never into the machine's python): offline, no dependencies resolved, at most 60 s.
# 2. Run `python -m benchmarks.gpu` with that directory and the repository on PYTHONPATH, at most
#    230 s (SIGTERM, then SIGKILL 10 s later), so that both fit in five minutes.
set -u
cd "$(dirname "$0")/../.."
GPU_PYTHON=${GPU_PYTHON:-python3}
GPU_WHEELS=${GPU_WHEELS:-.gpu-wheels}
if [ ! -f "$GPU_WHEELS/requirements.txt" ]; then
  echo "gpu-check: $GPU_WHEELS/requirements.txt is missing: run make gpu-wheels on a machine with network" \
    "and carry $GPU_WHEELS/ with the tree" >&2
  exit 2
fi
site=$(mktemp -d) || exit 2
trap 'rm -rf "$site"' EXIT
# PIP_CONFIG_FILE=/dev/null: an index or proxy in the machine's pip configuration is never tried.
if ! PIP_CONFIG_FILE=/dev/null timeout 60 "$GPU_PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-index --find-links "$GPU_WHEELS" --only-binary=:all: --no-deps --target "$site" \
    -r "$GPU_WHEELS/requirements.txt"; then
  echo "gpu-check: installing $GPU_WHEELS/ with '$GPU_PYTHON -m pip' failed (see above): is pip there, and" \
    "were the wheels made for this python's version (make gpu-wheels covers CPython 3.10-3.12)?" >&2
  exit 2
fi
PYTHONPATH="$site:$(pwd)" timeout --kill-after=10 230 "$GPU_PYTHON" -m benchmarks.gpu "$@"
