#!/usr/bin/env bash
# Download the wheels the device calls carry (`carry: [".whl"]`) into .whl/ at the repo root, as
# the device tool's README (workspace tool library) describes, and check them (envcheck.py wheels). .whl/ is
# git-ignored (.git/info/exclude), so a fresh clone runs this once before a GPU session.
#
#   bash benchmarks/gpu/fetch_wheels.sh
#
# What and why (the device image, device_packages.txt, lacks them; the device has no network):
#   tensorsocket 0.0.5  the comparison baseline of share_gpu.py (call C2); pure Python
#   pyzmq 27.3.0        needed by tensorsocket (Requires-Dist pyzmq>=25); bundles libzmq
#   tornado 6.6.1       needed by tensorsocket (Requires-Dist tornado>=6) and by zmq.eventloop
# tensorsocket's third need, torch, is in the image. Together about 1.4 MiB.
#
# And into .whl-ray/, carried only by round E (issue 20, Ray; RUNBOOK.md):
#   ray 2.60.0          without ray/jars/ (Java workers only: 31 MiB of the 76 MiB wheel, which
#                       alone is over the 64 MiB a device call may carry); about 45 MiB
#   jsonschema 4.26.0, jsonschema-specifications 2025.9.1, referencing 0.37.0, rpds-py 2026.9.1
#                       ray's needs the image lacks (the rest are in it)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
if EXCLUDE=$(git rev-parse --git-path info/exclude 2>/dev/null); then  # keep the wheels out of commits
  mkdir -p "$(dirname "$EXCLUDE")"
  for d in /.whl/ /.whl-ray/; do grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >>"$EXCLUDE"; done
fi
download() {  # download DIR REQUIREMENT...: wheels for the device's CPython 3.12, manylinux x86_64
  local dir=$1
  shift
  rm -rf "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dir" "$@"
}
download .whl tensorsocket==0.0.5 pyzmq==27.3.0 tornado==6.6.1
python3 benchmarks/gpu/envcheck.py wheels .whl
du -sh .whl

download .whl-ray ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
  rpds-py==2026.9.1
python3 - .whl-ray/ray-2.60.0-*.whl <<'PY'
import sys, zipfile
from pathlib import Path
path = Path(sys.argv[1])  # rewritten in place without ray/jars/ (files and RECORD lines)
tmp = path.with_suffix(".tmp")
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.startswith("ray/jars/"):
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(ln for ln in data.splitlines(keepends=True) if not ln.startswith(b"ray/jars/"))
        dst.writestr(item, data)
tmp.replace(path)
PY
python3 benchmarks/gpu/envcheck.py wheels .whl-ray
du -sh .whl-ray
