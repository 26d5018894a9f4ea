#!/usr/bin/env bash
# One device call of the GPU runbook (benchmarks/gpu/RUNBOOK.md), so the `run` command is short:
#
#   bash benchmarks/gpu/round.sh A1                      probe + benchmark (until the budget)
#   bash benchmarks/gpu/round.sh A2 <B>                  resume the benchmark of folder <B>
#   bash benchmarks/gpu/round.sh A3 <B>                  the same, once more
#   bash benchmarks/gpu/round.sh B1 <M>                  mini-trace: exclusive (one job per GPU)
#   bash benchmarks/gpu/round.sh B2 <M> <policy>         mini-trace: <policy> + auto, time-slicing
#   bash benchmarks/gpu/round.sh B3 <M> <policy>         mini-trace: <policy> + auto, MPS
#   bash benchmarks/gpu/round.sh C1 [<csv>]              estimator ground truth, C1_JOBS (4) at once
#   bash benchmarks/gpu/round.sh C2                      shared loading on the GPU (share_gpu.py)
#   bash benchmarks/gpu/round.sh D1                      first run without history: exclusive, then the default
#                                                        daemon (auto sharing) and the user's resubmission
#   bash benchmarks/gpu/round.sh D2 <D>                  D1's trace: auto MPS with history, carma-magm, auto TS
#   bash benchmarks/gpu/round.sh E1                      issue 20: one-node Ray cluster, serve --ray (carry .whl-ray)
#   bash benchmarks/gpu/round.sh E2                      issue 32 (optional): the same, a --nodes 1 torchrun job, NCCL
#   bash benchmarks/gpu/round.sh F1                      issue 35: the offender pays (fence, time-slicing), freeze/thaw
#   bash benchmarks/gpu/round.sh CHECK                   versions and imports only
#
#   bash benchmarks/gpu/round.sh --rehearse <CALL> ...   (or DRY=1) the same plumbing on a CPU
#
# Every call: prints versions (python, torch, CUDA, driver, GPU) and checks the imports it needs
# (envcheck.py) before spending time; installs the carried wheels (.whl, and .whl-ray for E calls,
# named in `carry`) into /tmp/site; runs its steps under a time budget (ROUND_BUDGET, default 540 s from the start, for a
# `run` with timeout_s 600), each step stopped by SIGINT at its limit so the harness cleans up;
# then kills whatever its steps left running (found by a per-call tag in their environment, MPS
# daemons asked to quit), and packs $OUT/w into $OUT/<CALL>.tgz beside $OUT/<CALL>.md (summary)
# and $OUT/<CALL>.log (everything printed): three files, well inside the 8 that come back.
# Unpack them here with benchmarks/gpu/unpack.sh.
#
# It never changes MIG settings or the compute mode and never resets the GPU; MPS is started only
# by the harness, in private temporary directories, and stopped again.
#
# --rehearse runs on a machine without a GPU: tiny CPU workloads, fake NVML, emulated GPUs, the
# scripts' dry runs, and a virtual environment that sees only the packages of the device image
# (device_packages.txt) plus those the wheels carry, so a missing import shows here first. OUT
# defaults to a new temporary folder; ROUND_BUDGET defaults to 150 s (240 s for B and D calls).
set -euo pipefail

REHEARSE=${DRY:-0}
# The interpreter every step runs (PYTHON, e.g. a virtual environment's, else python3 from PATH);
# a rehearsal swaps it for its restricted venv built over this one.
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--rehearse" ]]; then REHEARSE=1; shift; fi
CALL=${1:-}
shift || true
ARGS=("$@")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
GPU=benchmarks/gpu
# Paths are relative to the repo root; an absolute path of another checkout (this session's, say)
# is cut to its part from benchmarks/ on, which is where the copy on the device has it.
for i in "${!ARGS[@]}"; do
  a=${ARGS[$i]}
  if [[ "$a" == /* && ! -e "$a" && "$a" == */benchmarks/* ]]; then ARGS[$i]=benchmarks/${a#*/benchmarks/}; fi
done

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "$CALL" in
  A1|C2|D1|E1|E2|F1|CHECK) [[ ${#ARGS[@]} -eq 0 ]] || usage ;;
  D2) [[ ${#ARGS[@]} -eq 1 && -f "${ARGS[0]}/trace.json" ]] || { echo "D2 needs D1's folder <D> (with trace.json)" >&2; usage; } ;;
  A2|A3) [[ ${#ARGS[@]} -eq 1 && -f "${ARGS[0]}/results.jsonl" ]] || { echo "$CALL needs a bench folder with results.jsonl" >&2; usage; } ;;
  B2|B3) [[ ${#ARGS[@]} -eq 2 && -f "${ARGS[0]}/jobs.json" ]] || { echo "$CALL needs <M> (with jobs.json) and a policy" >&2; usage; } ;;
  B1) [[ ${#ARGS[@]} -eq 1 && -f "${ARGS[0]}/jobs.json" ]] || { echo "B1 needs <M> (with jobs.json)" >&2; usage; } ;;
  C1) [[ ${#ARGS[@]} -le 1 ]] || usage; [[ ${#ARGS[@]} -eq 0 || -f "${ARGS[0]}" ]] || { echo "C1: no file ${ARGS[0]}" >&2; usage; } ;;
  *) usage ;;
esac

T0=$(date +%s)
if [[ $REHEARSE == 1 ]]; then
  BUDGET=${ROUND_BUDGET:-150}
  [[ $CALL != [BD]* ]] || BUDGET=${ROUND_BUDGET:-240}  # two emulated replays (D: and estimates)
  [[ $CALL != F* ]] || BUDGET=${ROUND_BUDGET:-420}  # three daemons, real CPU jobs
  OUT=${OUT:-$(mktemp -d /tmp/round-rehearsal-XXXXXX)}
else
  BUDGET=${ROUND_BUDGET:-555}
  [[ -n "${OUT:-}" ]] || { echo "OUT is not set (on a CPU machine use --rehearse)" >&2; exit 2; }
  command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: not a GPU machine (use --rehearse)" >&2; exit 2; }
fi
mkdir -p "$OUT"
W=$OUT/w
LOG=$OUT/$CALL.log
TAG=round-$CALL-$$-$T0
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
SCRATCH=$(mktemp -d /tmp/round-scratch-XXXXXX)
STEPS=()
NOTES=()

left() { echo $((T0 + BUDGET - $(date +%s))); }
note() { echo "NOTE: $*"; NOTES+=("$*"); }

# ---------------------------------------------------------------- clean-up of what steps left
# Every step runs with COLLOCATE_ROUND_TAG=$TAG in its environment, which its children inherit
# (the daemon's jobs too: `collocate submit` passes the submitter's environment). Only processes
# carrying this call's tag are touched, by pid.
tagged() {  # pids of live processes with this call's tag
  local p
  for p in /proc/[0-9]*; do
    grep -qzxF "COLLOCATE_ROUND_TAG=$TAG" "$p/environ" 2>/dev/null && echo "${p#/proc/}"
  done
  return 0
}

sweep() {
  local pid cmd pipe n=0 mps=() pids
  pids=$(tagged)
  [[ -n "$pids" ]] || return 0
  sleep 3  # helpers such as multiprocessing's resource tracker end on their own, just after
  for pid in $(tagged); do
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    if [[ "$cmd" == *nvidia-cuda-mps* ]]; then mps+=("$pid"); continue; fi
    echo "leftover process $pid: ${cmd:0:160}"
    kill -KILL "$pid" 2>/dev/null && n=$((n + 1)) || true
  done
  for pid in "${mps[@]}"; do
    pipe=$(grep -az '^CUDA_MPS_PIPE_DIRECTORY=' "/proc/$pid/environ" 2>/dev/null | tr -d '\0' | sed 's/^CUDA_MPS_PIPE_DIRECTORY=//' || true)
    echo "leftover MPS daemon $pid (pipe ${pipe:-?}): asking it to quit"
    if [[ -n "$pipe" ]]; then echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 20 nvidia-cuda-mps-control || true; fi
    sleep 2
    kill -KILL "$pid" 2>/dev/null || true
    n=$((n + 1))
  done
  if ((n)); then note "step ${1:-?} left $n process(es) running; killed"; fi
}

# step NAME SECONDS CMD...: run CMD with SIGINT at SECONDS (SIGKILL 30 s later); never fails.
step() {
  local name=$1 secs=$2 t rc=0
  shift 2
  if ((secs < 5)); then
    note "step $name not started: only ${secs} s left"
    STEPS+=("| $name | not started | 0 s | ${secs} s |")
    return 0
  fi
  t=$(date +%s)
  echo "=== step $name (limit ${secs} s, $(left) s left in the call): $*"
  COLLOCATE_ROUND_TAG=$TAG timeout -s INT -k 30 "$secs" "$@" || rc=$?
  echo "=== step $name: exit $rc after $(($(date +%s) - t)) s"
  ((rc == 124)) && note "step $name reached its limit of ${secs} s and was interrupted"
  ((rc == 0)) || FAILED=1
  STEPS+=("| $name | $rc | $(($(date +%s) - t)) s | ${secs} s |")
  sweep "$name"
  return 0
}

FAILED=0
WHEEL_DIRS=(.whl)
[[ $CALL != E* ]] || WHEEL_DIRS+=(.whl-ray)  # Ray's 45 MiB travel only with the calls that use them

# ---------------------------------------------------------------- environment
prepare() {
  echo "=== round $CALL ${ARGS[*]:-} (rehearsal=$REHEARSE, budget ${BUDGET} s, OUT=$OUT) $(date -u +%FT%TZ)"
  mkdir -p "$W"
  if [[ $REHEARSE == 1 ]]; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      "$PY" "$GPU/envcheck.py" wheels .whl || note "the wheel check failed"
      # The device's install, for CPython 3.12 (the device's python3), into a scratch target.
      if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SCRATCH/site312" \
        --python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
        .whl/*.whl >"$SCRATCH/pip.log" 2>&1; then
        cat "$SCRATCH/pip.log"
        note "the carried wheels do not install for CPython 3.12"
      fi
      local py312 cand
      py312=""
      for cand in python3.12 /usr/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        if "$cand" -c 'import sys' >/dev/null 2>&1; then py312=$cand; break; fi
      done
      if [[ -n "$py312" ]]; then  # the compiled wheels (pyzmq, tornado) really load under 3.12
        PYTHONPATH=$SCRATCH/site312 "$py312" -c "import sys, zmq, tornado; print('carried wheels import under Python', sys.version.split()[0], ': zmq', zmq.__version__, 'tornado', tornado.version)" \
          || note "the carried wheels do not import under $py312"
      fi
    fi
    "$PY" "$GPU/envcheck.py" venv "$SCRATCH/venv" "${WHEEL_DIRS[@]}"
    PY=$SCRATCH/venv/bin/python3
    export PATH=$SCRATCH/venv/bin:$PATH
    export PYTHONPATH=$ROOT/src
  else
    export PYTHONPATH=$ROOT/src
    local wheels=() d
    for d in "${WHEEL_DIRS[@]}"; do
      if compgen -G "$d/*.whl" >/dev/null; then wheels+=("$d"/*.whl); fi
    done
    if ((${#wheels[@]})); then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
      export PYTHONPATH=/tmp/site:$ROOT/src PATH=/tmp/site/bin:$PATH
      echo "installed the carried wheels into /tmp/site: ${wheels[*]##*/}"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current --format=csv || true
    local apps
    apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null || true)
    [[ -z "$apps" ]] || note "the GPU already runs processes before this call: $apps"
  fi
  local gpu=--gpu
  [[ $REHEARSE == 0 ]] || gpu=""
  "$PY" "$GPU/envcheck.py" imports "$CALL" $gpu --meta "$W/meta.env" "${ARGS[*]:-}" "$REHEARSE" \
    || { note "imports missing (or no GPU visible): the call cannot run"; return 1; }
  # The command line parses its options with this machine's typer (not the version pinned here).
  "$PY" -m collocate.cli bench run --list --workloads dlrm --copies 1,2 --no-mixes >/dev/null \
    || { note "collocate's command line fails here (typer/click version?)"; return 1; }
}

# ---------------------------------------------------------------- the calls
call_A1() {
  if [[ $REHEARSE == 1 ]]; then
    step probe 60 "$PY" "$GPU/sigrun.py" "$GPU/nvml_probe.py" --dry-run --out "$W/probe"
  else
    step probe 150 "$PY" "$GPU/sigrun.py" "$GPU/nvml_probe.py" --out "$W/probe"
  fi
  bench_run
}

call_A2() {
  mkdir -p "$W/bench"
  cp "${ARGS[0]}/results.jsonl" "$W/bench/"
  [[ ! -f "${ARGS[0]}/samples.jsonl" ]] || cp "${ARGS[0]}/samples.jsonl" "$W/bench/"
  echo "resuming from ${ARGS[0]}: $(wc -l <"$W/bench/results.jsonl") records"
  bench_run --resume
}
call_A3() { call_A2; }

bench_run() {
  # The bench stops starting scenarios at its --budget; the step's limit is the hard stop.
  local budget=$(($(left) - 60)) limit=$(($(left) - 15))
  if [[ $REHEARSE == 1 ]]; then
    # A1 stops early on purpose, so that A2 rehearses the resume
    [[ $CALL != A1 ]] || budget=$((budget < 45 ? budget : 45))
    step bench "$limit" "$PY" "$GPU/sigrun.py" -m collocate.cli bench run --device cpu --seconds 1 --warmup 0.3 \
      --workloads resnet18-cifar,dlrm --copies 1,2 --no-mixes --out "$W/bench" --budget "$budget" "$@"
  else
    step bench "$limit" "$PY" "$GPU/sigrun.py" -m collocate.cli bench run --seconds 8 --warmup 4 --out "$W/bench" \
      --budget "$budget" "$@"
  fi
}

# A short run of each of the trace's workloads, all at once, before the measured runs: on a fresh
# machine the first jobs pay first loads (libraries from disk, kernels, cuDNN autotuning) that
# later runs do not. Round B1 of 2026-11-23 ran first on a fresh machine, and its first three
# jobs' first steps took 8-24 s beyond the steady rate (later jobs and later runs: 2-5 s).
WARM_PY='
import json, subprocess, sys, tempfile
jobs, dev = json.load(open(sys.argv[1]))["jobs"], sys.argv[2]
first = {}
for j in jobs:
    first.setdefault(j["workload"], j["batch_size"])
out = tempfile.mkdtemp()
procs = [subprocess.Popen([sys.executable, "-m", "collocate.bench.worker", "--workload", w, "--steps", "10",
                           "--batch-size", str(b), "--device", dev, "--out", f"{out}/{w}.json"])
         for w, b in first.items()]
codes = dict(zip(first, (p.wait() for p in procs)))
print("warm-up runs (exit codes):", codes)
sys.exit(max(codes.values()))
'

# mini_runs POLICY:SHARING...: one `minitrace run` each. Every run's --timeout is sized from the
# trace (1.2 x the sum of its jobs' solo durations + 20 s: the exclusive makespan with a margin;
# collocated runs end sooner), cut where needed so the later runs keep theirs.
mini_runs() {
  local m=${ARGS[0]} specs=("$@") n=$# i t p s spec sum nominal per=30  # per: daemon start and stop (~10 s measured)
  sum=$("$PY" -c 'import json,sys; print(int(sum(j["duration_s"] for j in json.load(open(sys.argv[1]))["jobs"])))' "$m/jobs.json")
  if [[ $REHEARSE == 1 ]]; then
    nominal=$((sum * 12 / 10 / 20 + 4 * $("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["jobs"]))' "$m/jobs.json") + 15))
  else
    nominal=$((sum * 15 / 10 + 30))  # jobs.json of 2026-11-22 leaves out the first steps' cost (~30%)
  fi
  echo "trace $m: solo durations add up to ${sum} s; nominal --timeout ${nominal} s per run"
  local dev=cuda
  [[ $REHEARSE == 0 ]] || dev=cpu
  step warm-up 90 "$PY" -c "$WARM_PY" "$m/jobs.json" "$dev"
  if [[ $REHEARSE == 0 ]] && ((n * (nominal + per) + 20 > $(left))); then
    note "the trace is long for $n runs in one call (solo durations add up to ${sum} s; up to about $(((($(left) - 20) / n - per - 20) * 10 / 12)) s fit): the runs get shorter timeouts and may not finish"
  fi
  for ((i = 0; i < n; i++)); do
    spec=${specs[$i]}
    p=${spec%%:*}
    s=${spec##*:}
    t=$(($(left) - 20 - per * (n - i) - nominal * (n - i - 1)))  # what is left after the later runs
    ((t >= nominal)) || t=$((($(left) - 20 - per * (n - i)) / (n - i)))  # else an equal share
    ((t < nominal)) || t=$nominal
    ((t >= nominal)) || note "run $p-$s gets --timeout $t s (nominal ${nominal} s)"
    # The mini-trace's jobs last 15-25 s: the default 30 s in-flight guard would be most of a job,
    # so the collocating policies get SETTLE_S (5 s), as the simulator's predictions in <M> did.
    local extra=()
    [[ $p == exclusive ]] || extra=(--param "settle_s=${SETTLE_S:-5}")
    if [[ $REHEARSE == 1 ]]; then
      step "$p-$s" $((t + per)) "$PY" "$GPU/sigrun.py" -m collocate.cli bench minitrace run "$m/jobs.json" --policy "$p" \
        --sharing "$s" --gpus emulated:1xH100-80GB --emulate --time-scale 0.05 --out "$W/$p-$s" --timeout "$t" "${extra[@]}"
    else
      step "$p-$s" $((t + per)) "$PY" "$GPU/sigrun.py" -m collocate.cli bench minitrace run "$m/jobs.json" --policy "$p" \
        --sharing "$s" --gpus nvml --out "$W/$p-$s" --timeout "$t" "${extra[@]}"
    fi
  done
}

# Exclusive runs alone: it takes about the sum of the solo durations (each job also pays 9-13 s of
# start-up on an H100), the collocated runs much less. Exclusive under MPS is not run: with one
# job per GPU, MPS changes nothing the mini-trace measures.
call_B1() { mini_runs exclusive:time-slicing; }
call_B2() { mini_runs "${ARGS[1]}:time-slicing" auto:time-slicing; }
call_B3() { mini_runs "${ARGS[1]}:mps" auto:mps; }

call_C1() {
  local resume=() dry=()
  [[ ${#ARGS[@]} -eq 0 ]] || resume=(--resume "${ARGS[0]}")
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step estimator $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/estimator_ground_truth.py" "${dry[@]}" \
    --out "$W/estimator_ground_truth.csv" --budget $(($(left) - 30)) --jobs "${C1_JOBS:-4}" "${resume[@]}"
}

call_C2() {
  local dry=()
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step share $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/share_gpu.py" "${dry[@]}" --out "$W/share_gpu.json" \
    --budget $(($(left) - 60))
}

# Issue 16's first run of real jobs (first_run_gpu.py): D1 prepares the trace (solo timings,
# `collocate estimate` per job) and runs exclusive and auto under MPS on fresh daemons; D2 runs the
# same commands again with D1's exclusive history, then the runs without history that D1 had no
# time for. The script skips a run its budget cannot hold.
first_run() {
  local dry=()
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step first-run $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/first_run_gpu.py" "${dry[@]}" \
    --out "$W/first_run" --budget-s $(($(left) - 25)) "$@"
}
call_D1() { first_run --runs exclusive,auto --train-s 6 ${FIRST_RUN_ARGS:-}; }
call_D2() { first_run --from "${ARGS[0]}" --runs auto-mps-history,carma-magm-mps,auto-ts ${FIRST_RUN_ARGS:-}; }

# Issue 20 (ray_one_node.py): a one-node Ray cluster on this machine (token auth, the collocate
# resource), `collocate serve --ray auto --gpus nvml`, two short real jobs; checks they ran on the
# real GPU and NVML measured them. Needs h-ray's `serve --ray` (collocate.cluster) and .whl-ray.
call_E1() {
  local dry=()
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step ray-one-node $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/ray_one_node.py" "${dry[@]}" \
    --out "$W/ray_one_node" --timeout-s $(($(left) - 60))
}

# Issue 32 (optional): the multi-node launch path with one part on the real GPU: a one-node Ray
# cluster, `submit --nodes 1 --gpus 1 -- torchrun --nproc-per-node 1 torchrun_allreduce.py`, an
# all-reduce over NCCL (gloo in the rehearsal). Carry .whl-ray as for E1.
call_E2() {
  local dry=()
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step torchrun-nccl $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/ray_one_node.py" "${dry[@]}" --torchrun \
    --out "$W/torchrun_nccl" --timeout-s $(($(left) - 60))
}

# Issue 35 (fence_freeze_gpu.py): under time-slicing a real PyTorch job overrunning its declaration
# beside one within it gets the out-of-memory error from its capped allocator, the other finishes;
# the same with --no-mem-fence charges the crash to the overrunning one; a frozen and thawed job
# ends with the same loss as one never frozen. About 4 minutes.
call_F1() {
  local dry=()
  [[ $REHEARSE == 0 ]] || dry=(--dry-run)
  step fence-freeze $(($(left) - 10)) "$PY" "$GPU/sigrun.py" "$GPU/fence_freeze_gpu.py" "${dry[@]}" \
    --out "$W/fence_freeze"
}

call_CHECK() { :; }

# ---------------------------------------------------------------- summary and packing
summary() {
  echo "# round $CALL ${ARGS[*]:-}$([[ $REHEARSE == 1 ]] && echo ' (REHEARSAL on a CPU: not GPU measurements)')"
  echo
  [[ ! -f "$W/meta.env" ]] || sed 's/^/    /' "$W/meta.env"
  echo
  echo "| step | exit | took | limit |"
  echo "|---|---|---|---|"
  ((${#STEPS[@]} == 0)) || printf '%s\n' "${STEPS[@]}"
  echo
  echo "call: $(($(date +%s) - T0)) s of a ${BUDGET} s budget"
  local n
  for n in "${NOTES[@]}"; do echo "- $n"; done
  echo
  case "$CALL" in
    A*)
      [[ ! -f "$W/bench/table.md" ]] || { echo "## bench"; echo; cat "$W/bench/table.md"; echo; }
      grep -h "budget of\|scenario(s) left" "$LOG" 2>/dev/null | tail -2 || true
      if compgen -G "$W/probe/*.md" >/dev/null; then echo "## probe"; echo; cat "$W"/probe/*.md; fi
      ;;
    B*)
      local d
      for d in "$W"/*/; do
        [[ -f "$d/summary.json" ]] || continue
        echo "- $(basename "$d"): $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ("done","jobs","failed","timed_out","makespan_min","mean_jct_min","sm_util","oom_crashes")})' "$d/summary.json")"
      done
      ;;
    C1)
      if [[ -f "$W/estimator_ground_truth.csv" ]]; then
        "$PY" -c 'import csv,sys,collections; r=list(csv.DictReader(open(sys.argv[1]))); print(len(r), "rows:", dict(collections.Counter(x["status"] for x in r)))' "$W/estimator_ground_truth.csv"
      fi
      grep -h "budget of" "$LOG" 2>/dev/null | tail -1 || true
      ;;
    D*)
      [[ ! -f "$W/first_run/summary.md" ]] || cat "$W/first_run/summary.md"
      ;;
    E*)
      for d in ray_one_node torchrun_nccl; do
        [[ ! -f "$W/$d/summary.json" ]] || "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); [print("-", "ok" if v else "FAIL", k) for k, v in d["checks"].items()]; print("jobs:", [(j["name"], j["state"], [(a["uuids"], a.get("peak_mib")) for a in j["attempts"]]) for j in d["jobs"]]); [print("stdout:", t.strip()) for t in d.get("stdout", [])]' "$W/$d/summary.json"
      done
      ;;
    F1)
      [[ ! -f "$W/fence_freeze/summary.md" ]] || cat "$W/fence_freeze/summary.md"
      ;;
    C2)
      [[ ! -f "$W/share_gpu.json" ]] || "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("correctness:", d["correctness"]); [print("-", r) for r in d["throughput"]]' "$W/share_gpu.json"
      ;;
  esac
  if [[ $REHEARSE == 0 ]]; then
    echo
    echo "GPU processes at the end: $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';')"
  fi
}

finish() {
  local rc=$?
  set +e
  trap - EXIT
  sweep end
  summary >"$OUT/$CALL.md" 2>&1
  cp "$OUT/$CALL.md" "$W/summary.md" 2>/dev/null
  tar -czf "$OUT/$CALL.tgz" -C "$W" . && rm -rf "$W"
  rm -rf "$SCRATCH"
  echo "=== packed $OUT/$CALL.tgz ($(du -h "$OUT/$CALL.tgz" | cut -f1)); summary $OUT/$CALL.md; call took $(($(date +%s) - T0)) s, exit $rc"
  exit "$rc"
}

main() {
  trap finish EXIT
  prepare
  "call_$CALL"
  return "$FAILED"
}

main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
