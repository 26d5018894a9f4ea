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
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
if [[ -d .git ]]; then  # keep the wheels out of commits (in a worktree, add /.whl/ by hand)
  mkdir -p .git/info
  grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
fi
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl tensorsocket==0.0.5 pyzmq==27.3.0 tornado==6.6.1
python3 benchmarks/gpu/envcheck.py wheels .whl
du -sh .whl
