"""End to end in a real headless browser: Debian's chromium driven by Playwright.

The dashboard is served over localhost by ``serve_in_thread`` from a fake source whose GPUs are
real emulated GPUs (one of them holding memory for a real process). The test checks that the
page shows the GPUs (with charts that have axes), the job counts, state badges in colour, the
reason a job waits, what a running job holds beside what it asked for, and the drain banner;
that a job added while the page is open appears without a reload, that one submitted through
the page's form appears with its quoted words kept together, that a job's own page
(``/jobs/<id>``) can be linked and shows its attempts and stderr, that user text (a job named
``<img src=x onerror=alert(1)>``) is never run as HTML, that screenshots show what the DOM
says (badge colours sampled from the pixels), and the token flow the daemon uses by default: the
URL's ``?token=`` once (then dropped from the address bar), a cookie after that, and a browser without either (or with a wrong one) refused.
Playwright never downloads a browser here: it launches the system chromium by path.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest

from collocate.gpus.emulated import EmulatedBackend
from collocate.gpus.emulated_state import process_start_time

CHROMIUM = os.environ.get("COLLOCATE_CHROMIUM") or shutil.which("chromium") or shutil.which(
    "chromium-browser")
# .ci/run sets COLLOCATE_REQUIRE_BROWSER=1: there a missing browser or driver fails, never skips.
if os.environ.get("COLLOCATE_REQUIRE_BROWSER") == "1":
    if CHROMIUM is None:
        pytest.fail("COLLOCATE_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install -y chromium)",
                    pytrace=False)
    import playwright.sync_api as playwright_sync
elif CHROMIUM is None:
    pytest.skip("no chromium on PATH (CI installs Debian's: apt-get install -y chromium)",
                allow_module_level=True)
else:
    playwright_sync = pytest.importorskip("playwright.sync_api",
                                          reason="pip install playwright (the browser test driver)")

from collocate.web.app import create_app
from collocate.web.server import serve_in_thread

from .fake_source import FakeSource

TIMEOUT_MS = 20_000
TOKEN = "browser-test-token-0123456789"


XSS = "<img src=x onerror=alert(1)>"
COLOURS = {"running": (0x1A, 0x5F, 0xB4), "pending": (0xB7, 0x79, 0x1F), "done": (0x2E, 0x7D, 0x32)}


def dominant_colour(png: bytes) -> tuple[int, int, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = image.getcolors(image.width * image.height)
    return max(counts)[1]


def close_to(colour: tuple[int, int, int], expected: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 12 for a, b in zip(colour, expected, strict=True))


def check_screenshot(png: bytes, min_colours: int) -> None:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.width >= 800 and image.height >= 400
    colours = image.getcolors(image.width * image.height) or []
    assert len(colours) >= min_colours, len(colours)  # not a blank or one-colour page


@pytest.mark.slow
def test_dashboard_live_in_headless_chromium(tmp_path):
    backend = EmulatedBackend.create(tmp_path / "emu", "2xA100-40GB", node="web")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    server = None
    try:
        started = process_start_time(holder.pid)
        assert backend.store.claim("GPU-emu-web-0", holder.pid, started, 12_000, 0.7, 0.2) is None
        source = FakeSource(backend)
        source.add_job("resnet", state="running", on=("web:0",), mem_mib=2048, held_mib=12_000)
        source.add_job("queued-bert", reason="memory: needs 6.0 GiB, most free 4.2 GiB on web:0")
        source.add_job(XSS, state="done", on=("web:1",))
        source.rows[-1]["reason"] = "<script>window.pwned = 1</script>"
        server = serve_in_thread(create_app(source, token=TOKEN), "127.0.0.1", 0)
        with playwright_sync.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu",
                                              "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(TIMEOUT_MS)
                dialogs: list[str] = []
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                assert page.goto(server.url + "?token=" + TOKEN).status == 200
                expect = playwright_sync.expect
                cards = page.locator("#gpus .gpu")
                expect(cards).to_have_count(2)
                assert "token" not in page.url  # the cookie carries it from here on
                gpu0 = page.locator('.gpu[data-uuid="GPU-emu-web-0"]')
                expect(gpu0).to_contain_text("11.72 GiB / 39.59 GiB used")  # units.format_mib
                expect(gpu0).to_contain_text("jobs: #1 11.72 GiB")
                expect(gpu0.locator("svg.chart")).to_have_count(2)
                expect(gpu0.locator("svg.chart").first).to_contain_text("SM activity (%)")
                expect(gpu0.locator("svg.chart").first).to_contain_text("100%")  # a y-axis label
                expect(page.locator('#running tr[data-job="1"]')).to_contain_text("resnet")
                running = page.locator('#running tr[data-job="1"]')
                expect(running).to_contain_text("2.00 GiB")  # what it asked for
                expect(running).to_contain_text("11.72 GiB")  # what it holds now
                expect(page.locator('#queue tr[data-job="2"]')).to_contain_text(
                    "memory: needs 6.0 GiB, most free 4.2 GiB on web:0")
                expect(page.locator('#counts .count[data-state="pending"]')).to_have_text("1 pending")
                expect(page.locator('#counts .count[data-state="running"]')).to_have_text("1 running")
                expect(page.locator('#counts .count[data-state="done"]')).to_have_text("1 done")
                expect(page.locator("#tracking")).to_contain_text("tracking degraded")
                expect(page.locator("#drain")).to_be_hidden()

                finished = page.locator('#finished tr[data-job="3"]')  # user text stays text
                expect(finished).to_contain_text(XSS)
                expect(finished).to_contain_text("<script>window.pwned = 1</script>")
                assert page.locator("main img, main script").count() == 0
                assert page.evaluate("window.pwned") is None and dialogs == []

                for state, colour in COLOURS.items():  # the state badges are drawn in colour
                    badge = page.locator(f"#counts .state-{state}")
                    box = badge.bounding_box()
                    assert box is not None and box["width"] > 20 and box["height"] > 8
                    assert close_to(dominant_colour(badge.screenshot()), colour), state
                shot = page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
                check_screenshot(shot, min_colours=40)

                source.draining = True
                expect(page.locator("#drain")).to_be_visible()
                expect(page.locator("#drain")).to_contain_text("collocate resume")

                new_id = source.add_job("added-during-test", state="running", on=("web:1",))
                expect(page.locator(f'#running tr[data-job="{new_id}"]')).to_contain_text(
                    "added-during-test")  # appears by polling, no reload
                expect(page.locator('.gpu[data-uuid="GPU-emu-web-1"]')).to_contain_text(
                    f"jobs: #{new_id}")
                with source.lock:  # frozen (issue 35): its state stays running, its badge says so
                    row = source.rows[int(new_id) - 1]
                    row["suspended"], row["reason"] = "user", "suspended by ann since 04:50:00"
                expect(page.locator(f'#running tr[data-job="{new_id}"] .badge')).to_have_text("suspended")
                expect(page.locator(f'#running tr[data-job="{new_id}"]')).to_contain_text("suspended by ann since")

                page.fill("#cmd", "python train_gpt.py --tag 'run one'")
                page.fill("#jobname", "from-the-form")
                page.click("#submit button")
                expect(page.locator("#submit-msg")).to_contain_text("queued job 5")
                expect(page.locator('#queue tr[data-job="5"]')).to_contain_text("from-the-form")
                assert source.submitted[-1] == ["python", "train_gpt.py", "--tag", "run one"]
                page.fill("#cmd", "python train.py --tag 'unclosed")
                page.click("#submit button")
                expect(page.locator("#submit-msg")).to_contain_text("no closing quotation")

                page.click('#running tr[data-job="1"]')
                assert page.url.endswith("/jobs/1")  # linkable
                detail = page.locator("#detail")
                expect(detail).to_contain_text("61.50 Wh")
                expect(page.locator("#detail-profile")).to_have_text(
                    "alone: SM 0.61, DRAM 0.20 (measured alone in this attempt)")
                expect(page.locator('#detail .own[data-key="loss"]')).to_contain_text(
                    "loss (last 0.1000)")  # the job's own metric beside the system ones
                expect(page.locator("#stdout")).to_contain_text("<b>not html</b>")
                expect(page.locator("#stderr")).to_contain_text("warning from resnet")
                expect(page.locator("#attempts tr")).to_have_count(3)
                expect(page.locator("#attempts")).to_contain_text("CUDA out of memory")
                assert page.locator("#detail b").count() == 0
                page.screenshot(path=str(tmp_path / "job.png"), full_page=True)

                linked = browser.new_context()  # a link to the job, opened with the token once
                try:
                    other = linked.new_page()
                    other.set_default_timeout(TIMEOUT_MS)
                    assert other.goto(server.url + "jobs/3?token=" + TOKEN).status == 200
                    expect(other.locator("#detail-title")).to_contain_text(XSS)
                    assert other.url.endswith("/jobs/3")
                    assert other.locator("main img").count() == 0
                    assert other.goto(server.url + "jobs/2").status == 200  # pending: never started
                    expect(other.locator("#attempts")).to_have_text("none yet")
                finally:
                    linked.close()

                page.reload()  # no token in the URL any more: the cookie is enough
                expect(page.locator("#detail-title")).to_contain_text("resnet")
                page.go_back()
                expect(page.locator("#detail-box")).to_be_hidden()

                stranger = browser.new_context()  # no cookie: refused, also with a wrong token
                try:
                    assert stranger.new_page().goto(server.url).status == 401
                    assert stranger.new_page().goto(server.url + "?token=wrong" + TOKEN).status == 401
                    assert stranger.new_page().goto(server.url + "jobs/1").status == 401
                finally:
                    stranger.close()
                assert dialogs == []
            finally:
                browser.close()
    finally:
        if server is not None:
            server.stop()
        holder.kill()
        holder.wait()
