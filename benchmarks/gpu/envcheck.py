"""Environment checks for the GPU rounds (``round.sh``); standard library only.

    python3 benchmarks/gpu/envcheck.py imports CALL [--gpu] [--meta FILE ARGS REHEARSE]
                                                        # import what CALL needs, print versions
                                                        # (--gpu: fail without CUDA; --meta:
                                                        # write the call's meta.env)
    python3 benchmarks/gpu/envcheck.py wheels .whl      # the carried wheels fit the device
    python3 benchmarks/gpu/envcheck.py venv DIR [WHEELDIR...]  # rehearsal: a venv that sees only
                                                        # the device image's packages (+ wheels)

``imports`` runs first in every device call, so a missing package ends the call in seconds
instead of minutes into it. ``wheels`` checks, without installing, that every wheel in the folder
installs on the device (CPython 3.12, manylinux x86_64), that no name comes twice, and that
every requirement of every wheel is another wheel or already in the device image
(``device_packages.txt``). ``venv`` builds, for the CPU rehearsal, a virtual environment whose
site-packages links only the distributions the device image has (plus those the wheels carry,
whose local installs stand in for them): an import that would fail on the device fails in the
rehearsal too, in every child process, because children run the same interpreter.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEVICE_PACKAGES = HERE / "device_packages.txt"

# What each call imports (top-level packages and the collocate modules its commands load).
COMMON = ["torch", "numpy", "typer", "rich", "psutil", "pynvml", "sortedcontainers",
          "collocate.cli", "collocate.bench.worker", "collocate.bench.runner",
          "collocate.gpus.nvml", "collocate.gpus.mps"]
NEEDS: dict[str, list[str]] = {
    "CHECK": ["matplotlib", "collocate.bench.report", "collocate.daemon.service", "PIL",
              "collocate.share", "collocate.estimate.entrypoint"],
    "A": ["matplotlib", "collocate.bench.report"],
    "B": ["collocate.daemon.service", "collocate.node.runner", "collocate.bench.minitrace_run"],
    "C1": ["collocate.estimate.entrypoint", "collocate.estimate.trace"],
    "C2": ["PIL", "collocate.share", "tensorsocket", "zmq", "tornado"],
    "D": ["collocate.daemon.service", "collocate.estimate.trace", "collocate.bench.minitrace_run"],
    "E": ["ray", "collocate.daemon.service", "collocate.cluster"],  # collocate.cluster: h-ray's head/agent
    "F1": ["collocate.daemon.service", "collocate.node.runner", "collocate.node.fence"],
}
# Imported when present; a missing one is reported with what it costs, and is not fatal.
_C1 = "C1 skips its configurations"
_C2 = "C2 cannot run: carry .whl (benchmarks/gpu/fetch_wheels.sh)"
_D = "D1/D2's GPU trace cannot run (the rehearsal's tiny jobs do not need it)"
OPTIONAL: dict[str, dict[str, str]] = {
    "C1": {"torchvision": _C1, "timm": _C1, "transformers": _C1},
    "D": {"torchvision": _D, "timm": _D, "transformers": _D},
    "CHECK": {"torchvision": _C1, "timm": _C1, "transformers": _C1,
              "tensorsocket": _C2, "zmq": _C2, "tornado": _C2},
}
TARGET_PY = (3, 12)
TARGET_PLATFORMS = re.compile(r"^(any|manylinux\d*_x86_64|manylinux_2_(\d+)_x86_64)$")
MAX_GLIBC_MINOR = 35  # the device image's glibc is at least this new (Python 3.12.3: Ubuntu 24.04)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_names() -> set[str]:
    lines = DEVICE_PACKAGES.read_text().splitlines()
    return {norm(n) for n in lines if n.strip() and not n.startswith("#")}


# ------------------------------------------------------------------ imports
def imports(call: str) -> int:
    key = call if call in NEEDS else call[:1] if call[:1] in ("A", "B", "D", "E") else call
    wanted = COMMON + NEEDS.get(key, [])
    optional = OPTIONAL.get(key, {})
    missing, lines = [], []
    for name in wanted + list(optional):
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
            why = f"{name}: {type(exc).__name__}: {exc}"
            if name in optional:
                lines.append(f"missing: {why} ({optional[name]})")
            else:
                missing.append(why)
            continue
        version = getattr(mod, "__version__", "") or getattr(mod, "version", "")
        where = "" if name.startswith("collocate") else f" ({Path(mod.__file__ or '?').parent})"
        lines.append(f"{name} {version}{where} [{time.monotonic() - t0:.1f} s]")
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = torch.cuda.is_available()
        print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, GPU visible: {cuda}"
              + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda else ""))
    for line in lines:
        print("  " + line)
    if missing:
        print("MISSING (this call cannot run):")
        for line in missing:
            print("  " + line)
        return 1
    return 0


# ------------------------------------------------------------------ wheels
def _wheel_tags(path: Path) -> tuple[str, str, str, str, str]:
    parts = path.name[:-4].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{path.name}: not a wheel file name")
    return parts[0], parts[1], parts[-3], parts[-2], parts[-1]


def _fits_device(py: str, abi: str, plat: str) -> str | None:
    """None when a wheel with these tags installs on CPython 3.12 / manylinux x86_64."""
    minor = TARGET_PY[1]

    def fits(tag: str) -> bool:
        return (tag == "py3" or tag == f"cp3{minor}"
                or (tag.startswith("cp3") and abi == "abi3" and int(tag[3:]) <= minor)
                or (tag.startswith("py3") and int(tag[3:]) <= minor))

    if not any(fits(tag) for tag in py.split(".")):
        return f"python tag {py}/{abi} does not fit CPython {TARGET_PY[0]}.{TARGET_PY[1]}"
    plats = plat.split(".")
    good = []
    for p in plats:
        m = TARGET_PLATFORMS.match(p)
        if m and (m.group(2) is None or int(m.group(2)) <= MAX_GLIBC_MINOR):
            good.append(p)
    if not good:
        return f"platform {plat} is not manylinux x86_64 (glibc <= 2.{MAX_GLIBC_MINOR})"
    return None


def _requirements(path: Path) -> list[tuple[str, str]]:
    """(name, full line) of every Requires-Dist that applies on CPython 3.12 Linux, no extras."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        spec, _, marker = req.partition(";")
        if marker and not _marker_applies(marker.strip()):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name:
            out.append((norm(name.group(0)), req))
    return out


def _marker_applies(marker: str) -> bool:
    """A small evaluator for the markers wheels use: extras never apply; the device is CPython
    3.12 on Linux x86_64."""
    if "extra" in marker:
        return False
    env = {"implementation_name": "cpython", "platform_python_implementation": "CPython",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": "x86_64", "python_version": f"{TARGET_PY[0]}.{TARGET_PY[1]}",
           "python_full_version": f"{TARGET_PY[0]}.{TARGET_PY[1]}.3"}
    expr = re.sub(r'"([^"]*)"', lambda m: repr(m.group(1)), marker)
    for key, value in env.items():
        expr = re.sub(rf"\b{key}\b", repr(value), expr)
    expr = re.sub(r"'(\d+(?:\.\d+)*)'", lambda m: repr(tuple(int(x) for x in m.group(1).split("."))),
                  expr) if "version" in marker else expr
    try:
        return bool(eval(expr, {"__builtins__": {}}, {}))  # our own substituted text
    except Exception:  # noqa: BLE001 - unknown marker: assume it applies, so it gets checked
        return True


def wheels(folder: Path) -> int:
    files = sorted(folder.glob("*.whl"))
    if not files:
        print(f"{folder}: no wheels")
        return 1
    problems: list[str] = []
    names: dict[str, list[str]] = {}
    total = 0
    for f in files:
        name, version, py, abi, plat = _wheel_tags(f)
        names.setdefault(norm(name), []).append(version)
        why = _fits_device(py, abi, plat)
        if why:
            problems.append(f"{f.name}: {why}")
        total += f.stat().st_size
        print(f"  {f.name}  {f.stat().st_size / 2**20:.2f} MiB")
    problems += [f"{n}: {len(v)} versions ({', '.join(v)}); keep one" for n, v in names.items()
                 if len(v) > 1]
    have = device_names() | set(names)
    for f in files:
        for req, line in _requirements(f):
            if req not in have:
                problems.append(f"{f.name} needs {line!r}: neither a wheel here nor in the image")
    print(f"{len(files)} wheels, {total / 2**20:.2f} MiB")
    for p in problems:
        print("PROBLEM: " + p)
    return 1 if problems else 0


# ------------------------------------------------------------------ rehearsal venv
def _top_entries(dist: md.Distribution) -> set[str]:
    tops: set[str] = set()
    for f in dist.files or []:
        first = Path(f).parts[0] if Path(f).parts else ""
        if first and first not in ("..", "__pycache__") and not first.endswith(".pth"):
            tops.add(first)
    if not tops:  # no RECORD: fall back on top_level.txt
        for line in (dist.read_text("top_level.txt") or "").split():
            tops.add(line)
    return tops


def venv(target: Path, wheel_dirs: list[Path]) -> int:
    """A venv over this interpreter whose site-packages holds links to allowed dists only."""
    allowed = device_names()
    carried = {norm(_wheel_tags(f)[0]) for d in wheel_dirs if d.is_dir() for f in d.glob("*.whl")}
    if not (target / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = Path(subprocess.run([str(target / "bin" / "python3"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    dists = {norm(d.metadata["Name"] or ""): d for d in md.distributions(path=[str(here)])}
    # The local versions of allowed packages may need more than the device's versions do (typer
    # 0.29 here needs pydantic; the device's older typer does not): allow what they require.
    extra: set[str] = set()
    todo = [n for n in dists if n in allowed or n in carried]
    while todo:
        for req in dists[todo.pop()].requires or []:
            spec, _, marker = req.partition(";")
            m = re.match(r"[A-Za-z0-9._-]+", spec.strip())
            if not m or (marker and not _marker_applies(marker.strip())):
                continue
            dep = norm(m.group(0))
            if dep in dists and dep not in allowed and dep not in carried and dep not in extra:
                extra.add(dep)
                todo.append(dep)
    linked, blocked = 0, []
    for name, dist in dists.items():
        if name not in allowed and name not in carried and name not in extra:
            blocked.append(name)
            continue
        for entry in _top_entries(dist):
            src, dst = here / entry, site / entry
            if src.exists() and not dst.exists():
                os.symlink(src, dst)
                linked += 1
    (target / "blocked.txt").write_text("\n".join(sorted(blocked)) + "\n")
    print(f"rehearsal venv {target}: {linked} entries linked; blocked (not on the device): "
          f"{', '.join(sorted(blocked)) or 'none'}")
    if carried:
        print(f"standing in for the carried wheels: {', '.join(sorted(carried))}")
    if extra:
        print(f"allowed as needs of the local versions of allowed packages: {', '.join(sorted(extra))}")
    return 0


def write_meta(path: Path, call: str, args: str, rehearse: bool) -> None:
    """meta.env of a call (shell-sourceable): device, driver, CUDA, torch, date; unpack.sh reads it."""
    import json

    from collocate.bench.envinfo import device_slug, environment

    env = environment("cpu" if rehearse else "cuda")
    meta = {"CALL": call, "ARGS": args, "REHEARSAL": int(rehearse), "DATE": env["date_utc"],
            "TIME_UTC": env["time_utc"],
            "DEVICE_SLUG": "rehearsal-cpu" if rehearse else device_slug(env),
            "DEVICE_NAME": env.get("device_name"), "DRIVER": env.get("driver"),
            "CUDA": env.get("cuda"), "TORCH": env.get("torch")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={json.dumps('' if v is None else str(v))}\n"
                            for k, v in meta.items()))
    print("meta: " + " ".join(f"{k}={v}" for k, v in meta.items()))


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "imports":
        # imports CALL [--gpu] [--meta FILE ARGS REHEARSE]
        rc = imports(argv[1])
        if rc == 0 and "--gpu" in argv and not sys.modules["torch"].cuda.is_available():
            print("MISSING: torch sees no CUDA device")
            rc = 1
        if rc == 0 and "--meta" in argv:
            i = argv.index("--meta")
            write_meta(Path(argv[i + 1]), argv[1], argv[i + 2], argv[i + 3] == "1")
        return rc
    if len(argv) >= 2 and argv[0] == "wheels":
        return wheels(Path(argv[1]))
    if len(argv) >= 2 and argv[0] == "venv":
        return venv(Path(argv[1]), [Path(a) for a in argv[2:]])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
