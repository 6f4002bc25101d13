"""The debug pages in a real browser: headless Chromium (Debian's), driven by Playwright,
against a real API process on the real local Redis and Triton. It finds a recent request,
opens its waterfall, and asks "why not" for a served and for a filtered item, reading each
answer from the rendered page. Screenshots go to the test's temporary directory (and, with
RECSYS_SCREENSHOTS=DIR, there too: docs/observability.md's come from a run with docs/debug)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.world.tables import load_seen
from loadtest.service import ApiProcess, start_api
from tests.integration.conftest import CONTEXT, Stack

pytestmark = pytest.mark.integration
USER = "u3"
# Flags for a headless Chromium on a machine with no network beyond loopback: without the
# background ones it tries (and fails) to reach its vendor's hosts at every start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "no Chromium on this machine: `make test` installs Debian's chromium where it "
            "can (as root, with apt-get); install it to run this test"
        )
    return found


@pytest.fixture
def api(stack: Stack, tmp_path: Path) -> Iterator[ApiProcess]:
    env = {
        "RECSYS_REDIS_URL": stack.redis_url,
        "RECSYS_TRITON_URL": stack.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(stack.world),
        "RECSYS_DEBUG_PAGES": "true",
        "RECSYS_TRACE_SAMPLE_PERCENT": "100",
    }
    process = start_api(env, tmp_path / "api.log")
    try:
        yield process
    finally:
        process.stop()


def _shots(tmp_path: Path) -> list[Path]:
    """Where screenshots go: the test's directory, and RECSYS_SCREENSHOTS if set."""
    folders = [tmp_path]
    if os.environ.get("RECSYS_SCREENSHOTS"):
        folders.append(Path(os.environ["RECSYS_SCREENSHOTS"]))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


def test_the_pages_answer_in_a_real_browser(api: ApiProcess, stack: Stack, tmp_path: Path) -> None:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    answer = httpx.post(
        f"{api.url}/recommend",
        json={"user_id": USER, "num_items": 10, "context": CONTEXT},
        timeout=10,
    ).json()
    served = answer["items"][0]["item_id"]
    seen = load_seen(stack.world)
    assert seen is not None
    at = seen.user_ids.tolist().index(USER)
    history = seen.item_ids[seen.offsets[at] : seen.offsets[at + 1]].tolist()
    folders = _shots(tmp_path)

    def shoot(page: object, name: str) -> None:
        for folder in folders:
            page.screenshot(path=str(folder / name), full_page=True)  # type: ignore[attr-defined]

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(f"{api.url}/debug/")
            link = page.locator(f"a.trace:text-is('{answer['answer_id']}')")
            assert link.count() == 1, page.content()
            assert USER in page.locator("#traces").inner_text()
            shoot(page, "debug-list.png")
            link.click()
            page.wait_for_selector("#waterfall")
            stages = page.locator("#waterfall rect.span")
            assert stages.count() == 8
            assert stages.first.get_attribute("data-stage") == "features"
            assert "rerank" in page.locator("#funnel").inner_text()
            assert served in page.locator("#answer").inner_text()
            shoot(page, "debug-trace.png")
            page.goto(f"{api.url}/debug/why")
            page.fill("#user_id", USER)
            page.fill("#item_id", served)
            page.click("#ask")
            page.wait_for_selector("#verdict")
            assert page.inner_text("#verdict") == "served"
            assert "served at rank" in page.inner_text("#because")
            shoot(page, "debug-why-served.png")
            verdict = ""
            for item in history[:40]:
                page.fill("#item_id", item)
                page.click("#ask")
                page.wait_for_selector("#verdict")
                verdict = page.inner_text("#verdict")
                if verdict == "filtered":
                    break
            assert verdict == "filtered"
            assert "removed by the seen filter" in page.inner_text("#because")
            shoot(page, "debug-why-filtered.png")
        finally:
            browser.close()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "debug-list.png",
        "debug-trace.png",
        "debug-why-filtered.png",
        "debug-why-served.png",
    ]
