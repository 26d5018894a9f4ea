#!/usr/bin/env bash
# Rehearse every device call of RUNBOOK.md on this CPU machine, in order, with the same unpack
# and CPU steps between them, into a temporary results folder (never benchmarks/results):
#
#   bash benchmarks/gpu/rehearse_all.sh [CALL...]     # default: A1 A2 B1 B2 B3 C1 C1 C2 D1 D2
#
# Each call runs `round.sh --rehearse` with a fresh $OUT (as the device empties it), then
# `unpack.sh` reads it back as it would read the tool's files_at. About 16 minutes on 2 cores (D1 and D2: 2-2.5 min each).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
GPU=benchmarks/gpu
export RESULTS=${RESULTS:-$(mktemp -d /tmp/rehearsal-results-XXXXXX)}
CALLS=("$@")
((${#CALLS[@]})) || CALLS=(A1 A2 B1 B2 B3 C1 C1 C2 D1 D2)
B="" M="" CSV="" D="" POLICY=carma-magm
times=()

call() {  # call CALL ARGS...: one rehearsed device call, then unpack
  local name=$1 out t rc=0
  out=$(mktemp -d /tmp/rehearsal-out-XXXXXX)
  t=$(date +%s)
  OUT=$out bash "$GPU/round.sh" --rehearse "$@" >/dev/null || rc=$?
  times+=("$name: exit $rc, $(($(date +%s) - t)) s; back: $(cd "$out" && ls | tr '\n' ' ')")
  echo "--- $name: exit $rc after $(($(date +%s) - t)) s; summary:"
  sed 's/^/    /' "$out/$name.md"
  UNPACKED=$(bash "$GPU/unpack.sh" "$name" "$out" "${@:2:1}") || echo "    unpack FAILED"
  echo "$UNPACKED" | sed 's/^/    unpack: /'
  rm -rf "$out"
}

for c in "${CALLS[@]}"; do
  case "$c" in
    A1)
      call A1
      B=$(echo "$UNPACKED" | sed -n 's/^B=//p')
      [[ "$B" == /* ]] || B=$ROOT/$B
      ;;
    A2 | A3)
      call "$c" "$B"
      python3 -m collocate.cli bench report "$B" | sed 's/^/    /'
      ;;
    B1 | B2 | B3)
      if [[ -z "$M" ]]; then  # the CPU steps of round B, from the rehearsal's bench folder
        M=$RESULTS/minitrace-rehearsal
        python3 -m collocate.cli bench minitrace build "$B" --out "$M" --jobs 12 --seed 0 --target-scale 0.4 | sed 's/^/    /'
        for s in time-slicing mps; do
          python3 -m collocate.cli simulate --trace "$M/trace.csv" --cluster 1xH100-80GB --sharing "$s" \
            --format json --policy "exclusive,$POLICY,auto" >"$M/sim-$s.json"
        done
      fi
      if [[ "$c" == B1 ]]; then call B1 "$M"; else call "$c" "$M" "$POLICY"; fi
      ;;
    C1)
      if [[ -z "$CSV" ]]; then
        call C1
        CSV=$(echo "$UNPACKED" | sed -n 's/^CSV=\(.*\) (.*/\1/p')
      else
        call C1 "$CSV"
      fi
      ;;
    C2) call C2 ;;
    D1)
      call D1
      D=$(echo "$UNPACKED" | sed -n 's/^D=//p')
      [[ "$D" == /* ]] || D=$ROOT/$D
      ;;
    D2) call D2 "$D" ;;
    CHECK) call CHECK ;;
    *) echo "unknown call $c" >&2; exit 2 ;;
  esac
done
if [[ -n "$M" && -d "$M/runs" ]]; then
  python3 -m collocate.cli bench minitrace compare --out "$M/compare.md" \
    $(for d in "$M"/runs/*/; do echo --real "$d"; done) --sim "$M/sim-time-slicing.json" --sim "$M/sim-mps.json" >/dev/null
  echo "--- compare.md:"
  sed 's/^/    /' "$M/compare.md"
fi
echo "--- rehearsal done; results in $RESULTS"
printf '    %s\n' "${times[@]}"
