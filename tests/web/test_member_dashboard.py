"""A lab member keeps their own dashboard open: ``collocate dashboard`` run by a real member
user of a root ``--group`` daemon, driven in headless chromium.

It acts with the member's rights, through the daemon's API alone (the state dir is closed to
members): their own jobs in full, with cancel, hold and release buttons that work; another
member's as the queue shows them (no command, no logs, no stderr in reasons); history of every
GPU (used beside committed memory) and of every user, over a range beyond two minutes; filters.
Screenshots are checked for content (not blank, the committed-memory bar's colour present).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_browser import CHROMIUM, TIMEOUT_MS, check_screenshot, playwright_sync

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))
from lab_harness import lab_daemon, lab_members, member_python, sh, stop_lab, why_no_lab, work_dir  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(why_no_lab() is not None, reason=str(why_no_lab()))]

SECRET = "hunter2-in-stderr"
ORANGE = (0xE6, 0xA2, 0x3C)  # the committed-memory bar


def submit(member, d, work, argv, **opts):
    answer = member.requests(d.state_dir, ("submit", {"argv": argv, "cwd": str(work), "mem": "4GiB",
                                                      "base_env": {"PATH": "/usr/bin:/bin"}, **opts}))[0]
    assert answer["ok"], answer
    return answer["result"]["id"]


def orange_pixels(png: bytes) -> int:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return sum(n for n, c in image.getcolors(image.width * image.height) or []
               if all(abs(a - b) <= 10 for a, b in zip(c, ORANGE, strict=True)))


def test_a_member_keeps_their_own_dashboard_open(tmp_path):
    alice, bob, _ = lab_members()
    work = work_dir()
    d = lab_daemon(period=0.2)
    dashboard = None
    try:
        running = submit(alice, d, work, ["/bin/sleep", "120"])
        held = submit(alice, d, work, ["/bin/sleep", "120"], hold=True)
        failed = submit(bob, d, work, sh(f"echo 'password {SECRET}' >&2; exit 2"))
        theirs = submit(bob, d, work, ["/bin/sleep", "120"])
        for job, state in ((running, "running"), (failed, "failed"), (theirs, "running")):
            d.wait_state(job, state)
        python, _ = member_python()
        dashboard = subprocess.Popen(
            [python, "-m", "collocate.cli", "dashboard", "--state-dir", str(d.state_dir), "--port", "0"],
            **alice.popen_args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = dashboard.stderr.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/\?token=\S+)", line)
        assert url is not None, line + dashboard.stderr.read() if dashboard.poll() is not None else line
        with playwright_sync.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.set_default_timeout(TIMEOUT_MS)
                expect = playwright_sync.expect
                assert page.goto(url[1]).status == 200
                expect(page.locator("#you")).to_have_text("you: collocate-m1")
                gpu = page.locator("#gpus .gpu").first
                expect(gpu).to_contain_text("committed to jobs")
                expect(gpu.locator("svg.chart")).to_have_count(2)
                mine = page.locator(f'#running tr[data-job="{running}"]')
                expect(mine.locator('button.act[data-action="cancel"]')).to_have_count(1)
                expect(page.locator(f'#running tr[data-job="{theirs}"] button.act')).to_have_count(0)
                waiting = page.locator(f'#queue tr[data-job="{held}"]')
                expect(waiting).to_contain_text("held by its owner")
                expect(waiting.locator('button.act[data-action="release"]')).to_have_count(1)

                page.click(f'#finished tr[data-job="{failed}"]')  # bob's failed job, as alice
                expect(page.locator("#detail-command")).to_contain_text("only its owner sees it")
                expect(page.locator("#stderr")).to_contain_text("belongs to collocate-m2")
                assert SECRET not in page.content()
                page.click(f'#running tr[data-job="{running}"] td >> nth=1')
                expect(page.locator("#detail-command")).to_have_text("/bin/sleep 120")

                page.select_option("#range", "3600")  # history beyond two minutes, per user too
                users = page.locator("#users .user")
                expect(page.locator('#users .user[data-user="collocate-m1"]')).to_contain_text("GPUs held")
                expect(page.locator('#users .user[data-user="collocate-m2"]')).to_have_count(1)
                assert users.count() >= 2

                page.fill("#filter-user", "collocate-m2")  # filters
                expect(page.locator(f'#running tr[data-job="{running}"]')).to_have_count(0)
                expect(page.locator(f'#running tr[data-job="{theirs}"]')).to_have_count(1)
                page.fill("#filter-user", "")

                shot = page.screenshot(path=str(tmp_path / "member.png"), full_page=True)
                check_screenshot(shot, min_colours=40)
                assert orange_pixels(gpu.screenshot()) > 50  # the committed bar is drawn

                waiting.locator('button.act[data-action="release"]').click()
                expect(page.locator(f'#running tr[data-job="{held}"]')).to_have_count(1, timeout=TIMEOUT_MS)
                mine.locator('button.act[data-action="cancel"]').click()
                expect(page.locator(f'#finished tr[data-job="{running}"]')).to_contain_text("cancelled")
                assert d.job(theirs)["state"] == "running"  # bob's job untouched throughout
            finally:
                browser.close()
    finally:
        if dashboard is not None:
            dashboard.terminate()
            try:
                dashboard.wait(timeout=15)
            except subprocess.TimeoutExpired:
                dashboard.kill()
        stop_lab(d)
        import shutil

        shutil.rmtree(work, ignore_errors=True)
