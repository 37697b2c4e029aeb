"""The status page in a real browser: headless Chromium (Debian's `chromium`,
which `make test` installs) loads a node's and a proxy's page from the
shared cluster; the DOM after its script ran shows the right queue depth,
and a screenshot of it is checked for what was drawn."""

from __future__ import annotations

import html.parser
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_until

pytestmark = pytest.mark.integration

WIDTH, HEIGHT = 1280, 900
HEADER = (0x1F, 0x4E, 0x3D)         # the page's header band
TABLE_HEADING = (0xE4, 0xEC, 0xE8)  # a table's heading row: drawn only once data came
BAR = (0x2D, 0x8A, 0x5F)            # a queue's depth bar


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian's chromium is needed for this test: `make test` installs it "
                    "(apt-get install chromium)")
    return found


def browse(url: str, *args: str) -> str:
    """Chromium, headless, on `url`; its stdout. The virtual time budget lets
    the page's script fetch /status.json and render before the snapshot."""
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", *args, url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class Rows(html.parser.HTMLParser):
    """The queue table's rows: data-uri -> the texts of its cells."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.texts: dict[str, str] = {}
        self._uri: str | None = None
        self._id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-uri"):
            self._uri = f"{found['data-uri']}|{found.get('data-app', '')}"
            self.rows[self._uri] = []
        elif tag == "td" and self._uri is not None:
            self.rows[self._uri].append("")
        if found.get("id"):
            self._id = found["id"]
            self.texts.setdefault(self._id, "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._uri = None

    def handle_data(self, data: str) -> None:
        if self._uri is not None and self.rows[self._uri]:
            self.rows[self._uri][-1] += data
        if self._id is not None:
            self.texts[self._id] += data
            self._id = None


def page(url: str) -> Rows:
    parsed = Rows()
    parsed.feed(browse(url, "--dump-dom"))
    return parsed


def test_a_nodes_page_shows_each_queues_depth_and_its_screenshot_what_was_drawn(cluster, tmp_path):
    from matplotlib import image

    from taproot import Session

    uri = f"taproot://demo/page-{uuid.uuid4().hex[:8]}"
    with Session([cluster.proxy_address]) as session:
        writer = session.open_queue(uri, write=True)
        for i in range(7):
            writer.post(f"m{i}".encode()).result(30)
    base = f"http://127.0.0.1:{cluster.http_ports['node1']}/"

    def shown():
        rows = page(base).rows
        return rows if f"{uri}|" in rows else None

    rows = wait_until(shown, 60, interval_s=1, what="the queue on the page")
    cells = rows[f"{uri}|"]
    # queue, partition, mode, consumers, producers, app, depth, (bar), unconfirmed, rates
    assert cells[:9] == [uri, "0", "priority", "0", "0", "-", "7", "", "0"]
    texts = page(base).texts
    assert texts["title"] == "Taproot node node1"
    assert "cluster test" in texts["subtitle"]

    shot = tmp_path / "node.png"
    browse(base, f"--screenshot={shot}")
    pixels = (image.imread(str(shot))[..., :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (HEIGHT, WIDTH)

    def share(region, color) -> float:
        return float((abs(region - color).max(axis=-1) <= 2).mean())

    assert share(pixels[4:40], HEADER) > 0.9          # the header band, across the top
    assert share(pixels[60:], TABLE_HEADING) > 0.002  # the tables, shown once the data came
    assert share(pixels[60:], BAR) > 0                # depth bars: some queue has messages waiting
    (Path(__file__).parent.parent / ".cache").mkdir(exist_ok=True)
    shutil.copy(shot, Path(__file__).parent.parent / ".cache" / "status-page.png")   # to look at


def test_a_proxys_page_shows_its_upstream(cluster):
    texts = page(f"http://127.0.0.1:{cluster.http_ports['proxy1']}/").texts
    assert texts["title"] == "Taproot proxy"
    assert f"upstream {cluster.node_address}" in texts["subtitle"]
    assert "retransmission buffer: 0 PUT(s)" in texts["role"]
