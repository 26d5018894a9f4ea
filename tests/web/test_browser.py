"""End to end in a real headless browser: Debian's chromium driven by Playwright.

The dashboard is served over localhost by ``serve_in_thread`` from a fake source whose GPUs are
real emulated GPUs (one of them holding memory for a real process). The test checks that the
page shows the GPUs and jobs, that a job added while the page is open appears without a reload,
that one submitted through the page's form appears, that user text is never run as HTML, and
the token flow the daemon uses by default: the URL's ``?token=`` once (then dropped from the
address bar), a cookie after that, and a browser without either (or with a wrong one) refused.
Playwright never downloads a browser here: it launches the system chromium by path.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_dashboard_live_in_headless_chromium(tmp_path):
    backend = EmulatedBackend.create(tmp_path / "emu", "2xA100-40GB", node="web")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    server = None
    try:
        started = process_start_time(holder.pid)
        assert backend.store.claim("GPU-emu-web-0", holder.pid, started, 12_000, 0.7, 0.2) is None
        source = FakeSource(backend)
        source.add_job("resnet", state="running", on=("web:0",))
        source.add_job("queued-bert")
        server = serve_in_thread(create_app(source, token=TOKEN), "127.0.0.1", 0)
        with playwright_sync.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu",
                                              "--disable-dev-shm-usage"])
            try:
                page = browser.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                assert page.goto(server.url + "?token=" + TOKEN).status == 200
                expect = playwright_sync.expect
                cards = page.locator("#gpus .gpu")
                expect(cards).to_have_count(2)
                assert "token" not in page.url  # the cookie carries it from here on
                expect(page.locator('.gpu[data-uuid="GPU-emu-web-0"]')).to_contain_text(
                    "12000 / 40536 MiB")
                expect(page.locator('.gpu[data-uuid="GPU-emu-web-0"]')).to_contain_text("jobs: #1")
                expect(page.locator('#running tr[data-job="1"]')).to_contain_text("resnet")
                expect(page.locator('#queue tr[data-job="2"]')).to_contain_text("queued-bert")
                expect(page.locator("#tracking")).to_contain_text("tracking degraded")

                new_id = source.add_job("added-during-test", state="running", on=("web:1",))
                expect(page.locator(f'#running tr[data-job="{new_id}"]')).to_contain_text(
                    "added-during-test")  # appears by polling, no reload
                expect(page.locator('.gpu[data-uuid="GPU-emu-web-1"]')).to_contain_text(
                    f"jobs: #{new_id}")

                page.fill("#cmd", "python train_gpt.py --lr 3e-4")
                page.fill("#jobname", "from-the-form")
                page.click("#submit button")
                expect(page.locator("#submit-msg")).to_contain_text("queued job 4")
                expect(page.locator('#queue tr[data-job="4"]')).to_contain_text("from-the-form")

                page.click('#running tr[data-job="1"]')
                expect(page.locator("#detail")).to_contain_text("61.50 Wh")
                expect(page.locator("#detail-profile")).to_have_text(
                    "alone: SM 0.61, DRAM 0.20 (measured alone in this attempt)")
                expect(page.locator('#detail .own[data-key="loss"]')).to_contain_text(
                    "loss (last 0.1000)")  # the job's own metric beside the system ones
                expect(page.locator("#detail pre")).to_contain_text("<b>not html</b>")
                assert page.locator("#detail b").count() == 0

                page.reload()  # no token in the URL any more: the cookie is enough
                expect(page.locator('#running tr[data-job="1"]')).to_contain_text("resnet")

                stranger = browser.new_context()  # no cookie: refused, also with a wrong token
                try:
                    assert stranger.new_page().goto(server.url).status == 401
                    assert stranger.new_page().goto(server.url + "?token=wrong" + TOKEN).status == 401
                finally:
                    stranger.close()
            finally:
                browser.close()
    finally:
        if server is not None:
            server.stop()
        holder.kill()
        holder.wait()
