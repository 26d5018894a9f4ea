"""The page a lab keeps open, laid out on the screens it is kept open on (issue 37).

Served by ``serve_in_thread`` from a fake source over 8 real emulated GPUs (a real process
holding memory on one), 3 running jobs, 2 pending and 32 finished in every end state, and a
history in which one member held GPUs, then none, then the daemon was down. Driven in Debian's
chromium at 1400x900 and 1920x1080, it checks layout facts, not pixels alone: the GPU cards
fill the width (at least 3 a row at 1400 px, 5 at 1920 px), the Running table starts within the
first screen, the finished list is paged by the server (15 rows, then the next page), the
header counts every state (timeout and cancelled included, zeros too), each GPU card shows
power and says which readings the backend cannot give (emulated GPUs: temperature, clocks) and
lists the processes on it with their jobs, the host's CPU and RAM are shown, and a user chart
breaks its line where nothing was held or sampled. Screenshots are written to
``$COLLOCATE_SCREENSHOTS`` (default: the test's tmp dir) to be looked at.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.emulated_state import process_start_time
from collocate.web.app import FINISHED_PER_PAGE, create_app
from collocate.web.server import serve_in_thread

from .fake_source import FakeSource
from .test_browser import CHROMIUM, TIMEOUT_MS, check_screenshot, playwright_sync

BOXES = """sel => [...document.querySelectorAll(sel)].map(e => {
  const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, width: r.width}; })"""
END_STATES = ("done", "failed", "timeout", "cancelled", "rejected")


class HistorySource(FakeSource):
    """A fake with a day of history: ann held one GPU, then none (sampled), then nothing was
    sampled at all (the daemon was down), then she held one again."""

    def history(self, since_s: float) -> dict[str, Any]:
        now = time.time()
        step = since_s / 12
        ts = [now - since_s + (i + 0.5) * step for i in range(12)]
        held = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, None, None, None, 1.0, 1.0, 1.0]
        return {"since": now - since_s, "until": now, "step_s": step, "gpus": [],
                "users": [{"user": "ann", "points": [
                    {"t": t, "gpus": g, "mem_mib": None if g is None else 4096 * g,
                     "energy_wh": None if g is None else g} for t, g in zip(ts, held, strict=True)]}]}


def shots_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("COLLOCATE_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.slow
def test_the_page_fills_wide_screens_running_first_finished_paged(tmp_path):
    backend = EmulatedBackend.create(tmp_path / "emu", "8xA100-40GB", node="lab")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    server = None
    try:
        assert backend.store.claim("GPU-emu-lab-0", holder.pid, process_start_time(holder.pid),
                                   9_000, 0.6, 0.2) is None
        source = HistorySource(backend)
        first = source.add_job("resnet", state="running", on=("lab:0",), held_mib=9_000)
        source.owner[holder.pid] = first
        source.add_job("bert", state="running", on=("lab:1",), user="bob")
        source.add_job("gpt", state="running", on=("lab:2",), user="cat")
        source.add_job("waits-1", reason="memory: needs 30.0 GiB, most free 21.0 GiB on lab:0")
        source.add_job("waits-2", reason="busy: every GPU is saturated")
        for i in range(32):
            source.add_job(f"old-{i}", state=END_STATES[i % len(END_STATES)], on=("lab:3",))
        server = serve_in_thread(create_app(source), "127.0.0.1", 0)
        out = shots_dir(tmp_path)
        with playwright_sync.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                for width, height, per_row in ((1400, 900, 3), (1920, 1080, 5)):
                    page = browser.new_page(viewport={"width": width, "height": height})
                    page.set_default_timeout(TIMEOUT_MS)
                    expect = playwright_sync.expect
                    assert page.goto(server.url).status == 200
                    cards = page.locator("#gpus .gpu")
                    expect(cards).to_have_count(8)
                    expect(page.locator("#users .user")).to_have_count(1)
                    boxes = page.evaluate(BOXES, "#gpus .gpu")  # at one moment: polls redraw
                    top = min(b["y"] for b in boxes)
                    row = [b for b in boxes if abs(b["y"] - top) < 2]
                    assert len(row) >= per_row, (width, len(row))
                    assert max(b["x"] + b["width"] for b in row) >= 0.95 * width - 32  # no empty half
                    chart = page.evaluate(BOXES, "#gpus .gpu svg.chart")[0]
                    assert chart["width"] >= 0.85 * boxes[0]["width"]  # charts fill their card

                    running = page.locator("#running")
                    expect(running.locator("tr[data-job]")).to_have_count(3)
                    assert running.bounding_box()["y"] < height  # who is where: on the first screen
                    assert page.locator("#queue").bounding_box()["y"] < height

                    finished = page.locator("#finished tr[data-job]")
                    expect(finished).to_have_count(FINISHED_PER_PAGE)
                    expect(page.locator("#finished-page")).to_have_text("page 1 of 3")
                    expect(page.locator("#finished-total")).to_have_text("(32)")
                    for state in (*END_STATES, "pending", "running"):
                        n = {"pending": 2, "running": 3}.get(state) or sum(
                            1 for i in range(32) if END_STATES[i % len(END_STATES)] == state)
                        expect(page.locator(f'#counts .count[data-state="{state}"]')).to_have_text(
                            f"{n} {state}")

                    gpu0 = page.locator('.gpu[data-uuid="GPU-emu-lab-0"]')
                    expect(gpu0.locator(".readings")).to_contain_text("power ")
                    expect(gpu0.locator(".readings")).to_contain_text(
                        "not read by this backend: temperature, SM clock, memory clock")
                    expect(gpu0.locator(".procs")).to_contain_text(str(holder.pid))
                    expect(gpu0.locator(".procs")).to_contain_text(f"#{first}")
                    expect(gpu0.locator(".procs")).to_contain_text("8.79 GiB")
                    expect(page.locator("#host")).to_contain_text("host: CPU")
                    expect(page.locator("#host")).to_contain_text("RAM")

                    # gaps stay gaps: held, none (zero), unsampled (a break), held again
                    gpus_held = page.locator("#users .user svg.chart").first
                    assert gpus_held.locator("polyline.line").count() == 2
                    shot = page.screenshot(path=str(out / f"dashboard-{width}.png"), full_page=False)
                    check_screenshot(shot, min_colours=40)

                    page.click("#older")
                    expect(page.locator("#finished-page")).to_have_text("page 2 of 3")
                    page.click("#older")
                    expect(page.locator("#finished-page")).to_have_text("page 3 of 3")
                    expect(finished).to_have_count(32 - 2 * FINISHED_PER_PAGE)
                    expect(page.locator("#older")).to_be_disabled()
                    page.select_option("#filter-state", "timeout")  # filtered on the server
                    expect(page.locator("#finished-page")).to_have_text("page 1 of 1")
                    expect(finished).to_have_count(sum(1 for i in range(32) if i % len(END_STATES) == 2))
                    page.screenshot(path=str(out / f"dashboard-{width}-full.png"), full_page=True)
                    page.close()
            finally:
                browser.close()
    finally:
        if server is not None:
            server.stop()
        holder.kill()
        holder.wait()
