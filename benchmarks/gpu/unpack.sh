#!/usr/bin/env bash
# Put what a device call of round.sh sent back into the repo (run here, on the CPU machine):
#
#   bash benchmarks/gpu/unpack.sh A1 <files_at>          -> prints B=benchmarks/results/bench-<device>-<date>
#   bash benchmarks/gpu/unpack.sh A2 <files_at> <B>      (A3 the same)
#   bash benchmarks/gpu/unpack.sh B1 <files_at> <M>      (B2, B3 the same) -> <M>/runs/<policy>-<sharing>/
#   bash benchmarks/gpu/unpack.sh C1 <files_at> [<csv>]  -> benchmarks/results/estimator_ground_truth-<device>-<date>.csv
#                                                          (or <csv>, the file C1 resumed from)
#   bash benchmarks/gpu/unpack.sh C2 <files_at>          -> benchmarks/results/share_gpu-<device>-<date>.json
#   bash benchmarks/gpu/unpack.sh D1 <files_at>          -> prints D=benchmarks/results/first_run-<device>-<date>
#   bash benchmarks/gpu/unpack.sh D2 <files_at> <D>      -> D2's runs into <D>; its summary.{json,md} has D1's runs too
#   bash benchmarks/gpu/unpack.sh E1 <files_at>          -> benchmarks/results/ray_one_node-<device>-<date>/
#
# <files_at> is the folder the `run` tool's reply names. The device and date come from the call's
# meta.env. Every call's summary and log go to benchmarks/results/gpu-rounds/<date>-<device>-<CALL>.{md,log}
# (<CALL>-<HHMM>, the call's start time, when an earlier call of that name and date is there).
# RESULTS=<dir> writes elsewhere than benchmarks/results; a rehearsal's files are refused there.
set -euo pipefail

CALL=${1:?CALL}
FILES=${2:?files_at}
DEST=${3:-}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULTS=${RESULTS:-$ROOT/benchmarks/results}
TMP=$(mktemp -d /tmp/unpack-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

if [[ -f "$FILES/$CALL.tgz" ]]; then
  tar -xzf "$FILES/$CALL.tgz" -C "$TMP"
elif [[ -d "$FILES/w" ]]; then  # the call was stopped before it packed: take what came back
  echo "warning: no $CALL.tgz; using the unpacked $FILES/w (the call did not finish)" >&2
  cp -r "$FILES/w/." "$TMP/"
else
  echo "no $FILES/$CALL.tgz and no $FILES/w" >&2
  exit 1
fi
[[ -f "$TMP/meta.env" ]] || { echo "no meta.env in what came back" >&2; exit 1; }
# shellcheck disable=SC1091
source "$TMP/meta.env"
if [[ "$REHEARSAL" == 1 && "$(cd "$RESULTS" 2>/dev/null && pwd)" == "$ROOT/benchmarks/results" ]]; then
  echo "a rehearsal's results do not go into benchmarks/results: set RESULTS" >&2
  exit 1
fi
mkdir -p "$RESULTS/gpu-rounds"
STEM=$RESULTS/gpu-rounds/$DATE-$DEVICE_SLUG-$CALL
if [[ -f "$STEM.md" && -f "$FILES/$CALL.md" ]] && ! cmp -s "$FILES/$CALL.md" "$STEM.md"; then
  # the same call ran earlier that day: keep its summary, name this one by its start time
  STEM=$STEM-$(echo "$TIME_UTC" | cut -c12-16 | tr -d :)
fi
for ext in md log; do
  if [[ -f "$FILES/$CALL.$ext" ]]; then cp "$FILES/$CALL.$ext" "$STEM.$ext"; fi
done

case "$CALL" in
  A1)
    B=$RESULTS/bench-$DEVICE_SLUG-$DATE
    mkdir -p "$B"
    [[ ! -d "$TMP/bench" ]] || cp "$TMP"/bench/* "$B/"
    if compgen -G "$TMP/probe/*" >/dev/null; then cp "$TMP"/probe/* "$RESULTS/"; fi
    echo "B=${B#"$ROOT"/}"
    ;;
  A2 | A3)
    B=${DEST:?"$CALL needs <B>"}
    old=$(wc -l <"$B/results.jsonl")
    new=$(wc -l <"$TMP/bench/results.jsonl")
    if ((new < old)); then
      echo "the returned results.jsonl has $new lines, fewer than the $old of $B: not copied" >&2
      exit 1
    fi
    cp "$TMP"/bench/* "$B/"
    echo "B=$B: $old -> $new records"
    ;;
  B1 | B2 | B3)
    M=${DEST:?"$CALL needs <M>"}
    mkdir -p "$M/runs"
    for d in "$TMP"/*/; do
      [[ -f "$d/summary.json" || -f "$d/daemon.log" ]] || continue
      rm -rf "$M/runs/$(basename "$d")"
      cp -r "$d" "$M/runs/$(basename "$d")"
      echo "run $(basename "$d") -> $M/runs/$(basename "$d")"
    done
    ;;
  C1)
    CSV=${DEST:-$RESULTS/estimator_ground_truth-$DEVICE_SLUG-$DATE.csv}
    cp "$TMP/estimator_ground_truth.csv" "$CSV"
    echo "CSV=$CSV ($(($(wc -l <"$CSV") - 1)) rows)"
    ;;
  C2)
    J=$RESULTS/share_gpu-$DEVICE_SLUG-$DATE.json
    cp "$TMP/share_gpu.json" "$J"
    echo "JSON=$J"
    ;;
  D1 | D2)
    D=${DEST:-$RESULTS/first_run-$DEVICE_SLUG-$DATE}
    [[ $CALL == D1 || -n "$DEST" ]] || { echo "D2 needs <D>" >&2; exit 1; }
    mkdir -p "$D"
    [[ ! -d "$TMP/first_run" ]] || cp -r "$TMP/first_run/." "$D/"
    echo "D=${D#"$ROOT"/}"
    ;;
  E1)
    E=$RESULTS/ray_one_node-$DEVICE_SLUG-$DATE
    mkdir -p "$E"
    [[ ! -d "$TMP/ray_one_node" ]] || cp -r "$TMP/ray_one_node/." "$E/"
    echo "E=${E#"$ROOT"/}"
    ;;
  F1)
    F=$RESULTS/fence_freeze-$DEVICE_SLUG-$DATE
    mkdir -p "$F"
    [[ ! -d "$TMP/fence_freeze" ]] || cp -r "$TMP/fence_freeze/." "$F/"
    echo "F=${F#"$ROOT"/}"
    ;;
  CHECK) ;;
  *) echo "unknown call $CALL" >&2; exit 2 ;;
esac
echo "summary: $STEM.md"
