"""Screenshots of the Dagster UI from a real run of the example:
docs/screenshots/{runs,materializations,lag,lag_over_time}.png.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--rate 300] [--min-ranges 48] [--min-reports 8]
        [--timeout 1200] [--spark connect|local] [--lock FILE] [--keep]

It starts what ``scripts/example.sh`` starts (the local broker, the clickstream producer, the local Spark
Connect server, ``dagster dev`` with the example project on 127.0.0.1), all in a temporary directory, waits
until ``--min-ranges`` ranges were committed and materialized with their lag (the points of the lag plot) and
``--min-reports`` lag reports were observed (the points of the lag-over-time plots), then
drives headless Chromium over the DevTools protocol: the pages render client-side and the plots only appear
after clicks, which ``chromium --screenshot`` cannot wait for or make. Every page is checked for what it must
show (and for Dagster's error and loading states) before it is captured, and the three files replace the old
ones only when all three were taken. Everything started is stopped by PID at the end, also on error or
Ctrl-C; after an error the temporary directory (logs, and the page as it was) is kept.

The run is heavy (Spark, dagster dev, a browser). With ``--lock FILE`` it holds an exclusive ``flock`` on FILE
for its whole duration, so other heavy jobs on a small machine that take the same lock wait instead of
competing for the CPU (and distorting the page timings).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dagster_streamgroup.dagster.devserver import DagsterDev, wait_for  # noqa: E402
from dagster_streamgroup.local.kafka_broker import running_broker  # noqa: E402

ASSET = "page_views_per_minute"
WIDTH, HEIGHT = 1500, 950
CHROMIUM = "/usr/bin/chromium"
NAMES = ("runs.png", "materializations.png", "lag.png", "lag_over_time.png")
FIRST_SHARD = "clicks:0"


def log(message: str) -> None:
    print(f"screenshots: {message}", flush=True)


@contextlib.contextmanager
def cpu_lock(path: str) -> Iterator[None]:
    """flock(2), as ``flock(1)`` takes it: do not also wrap the script in ``flock`` on the same file."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        log(f"waiting for the lock {path}")
        fcntl.flock(handle, fcntl.LOCK_EX)
        log("lock taken")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGINT to the process group we started (its own session), then SIGKILL what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@contextlib.contextmanager
def producer(bootstrap: str, rate: int, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.clickstream_events", "--bootstrap", bootstrap, "--rate", str(rate)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_group(proc)


@contextlib.contextmanager
def spark_remote(spark: str) -> Iterator[str | None]:
    """The Spark Connect server the runs attach to (as example.sh does by default), or None for local[2]."""
    if spark == "local":
        yield None
        return
    from dagster_streamgroup.local.spark_connect import running_connect_server

    with running_connect_server() as server:
        yield server.remote


@contextlib.contextmanager
def example(work: Path, args: argparse.Namespace) -> Iterator[DagsterDev]:
    """The example's services, stopped in the reverse order of their start (dagster dev first, broker last)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with running_broker() as broker:
        log(f"broker on {broker.bootstrap} (pid {broker.pid})")
        with producer(broker.bootstrap, args.rate, work / "producer.log") as events:
            log(f"producer pid {events.pid}, ~{args.rate} events/s")
            with spark_remote(args.spark) as remote:
                env = {
                    "CLICKSTREAM_BOOTSTRAP": broker.bootstrap,
                    "CLICKSTREAM_OUTPUT": str(work / "output" / "clickstream"),
                    "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_IP": "127.0.0.1",
                }
                if remote is not None:
                    log(f"Spark Connect server at {remote}")
                    env["CLICKSTREAM_SPARK_REMOTE"] = remote
                dev = DagsterDev(work / "dagster_home", env, work / "dagster-dev.log")
                try:
                    dev.start()
                    assert dev.proc is not None
                    log(f"dagster dev on {dev.url} (pid {dev.proc.pid})")
                    yield dev
                finally:
                    dev.stop()


@dataclass(frozen=True)
class Progress:
    statuses: dict[str, int]
    lag_points: list[dict[str, Any]]
    """Materializations that carry ``lag``: partition, timestamp and their int metadata."""
    first_shard_reports: int
    """Lag observations (a member's report every 30 s) that carry the first shard's seconds behind."""


def progress(dev: DagsterDev) -> Progress:
    statuses: dict[str, int] = {}
    for run in dev.runs():
        statuses[run["status"]] = statuses.get(run["status"], 0) + 1
    data = dev.graphql(
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
             assetMaterializations(limit: 1000) { partition timestamp metadataEntries { label
               ... on IntMetadataEntry { intValue } } } } } }""",
        {"k": {"path": [ASSET]}},
    )["assetOrError"]
    points = []
    for event in data["assetMaterializations"]:
        values = {e["label"]: e.get("intValue") for e in event["metadataEntries"]}
        if values.get("lag") is not None:
            points.append({"partition": event["partition"], "timestamp": event["timestamp"], **values})
    observed = dev.graphql(
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
             assetObservations(limit: 1000) { metadataEntries { label } } } } }""",
        {"k": {"path": [ASSET]}},
    )["assetOrError"]
    reports = sum(
        any(e["label"] == f"seconds_behind {FIRST_SHARD}" for e in event["metadataEntries"])
        for event in observed["assetObservations"]
    )
    return Progress(statuses=statuses, lag_points=points, first_shard_reports=reports)


def wait_for_data(dev: DagsterDev, min_ranges: int, min_reports: int, timeout_s: float) -> Progress:
    started = time.monotonic()
    seen: list[Progress] = []

    def enough() -> Progress | None:
        now = progress(dev)
        if not seen or (len(now.lag_points), now.first_shard_reports) != (
            len(seen[-1].lag_points),
            seen[-1].first_shard_reports,
        ):
            log(
                f"{time.monotonic() - started:4.0f} s: runs {now.statuses}, {len(now.lag_points)} lag points, "
                f"{now.first_shard_reports} lag reports of {FIRST_SHARD}"
            )
        seen[:] = [now]
        return now if len(now.lag_points) >= min_ranges and now.first_shard_reports >= min_reports else None

    try:
        return wait_for(f"{min_ranges} materialized ranges and {min_reports} lag reports", enough, timeout_s, 5.0)
    except TimeoutError as exc:
        last = seen[-1] if seen else None
        raise TimeoutError(f"{exc}; runs so far: {last.statuses if last else 'none'}; see {dev.log}") from None


class CdpError(RuntimeError):
    pass


class Page:
    """One browser tab over the DevTools protocol (JSON messages on a websocket)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    def call(self, method: str, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") != ident:
                continue  # an event, or the answer to an earlier call
            if "error" in message:
                raise CdpError(f"{method}: {message['error']}")
            result = message.get("result", {})
            assert isinstance(result, dict)
            return result

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_until(self, what: str, expression: str, timeout_s: float = 90.0) -> None:
        """Polls a JS condition; a page showing Dagster's error state fails at once, with its text."""
        deadline = time.monotonic() + timeout_s
        last: CdpError | None = None
        while time.monotonic() < deadline:
            error = self.evaluate(PAGE_ERROR_JS)
            if error:
                raise CdpError(f"{what}: the page shows an error: {error}")
            try:
                if self.evaluate(expression):
                    return
            except CdpError as exc:  # the document is being replaced (no body yet) or still rendering
                last = exc
            time.sleep(0.5)
        text = self.evaluate("document.body ? document.body.innerText.slice(0, 600) : ''")
        raise TimeoutError(f"{what}: not shown within {timeout_s:.0f} s (last error: {last}); the page reads: {text!r}")

    def settle(self, seconds: float = 2.0) -> None:
        """No spinner for ``seconds`` in a row: late queries (counts, tags) have filled in."""
        deadline = time.monotonic() + 60
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if self.evaluate(SPINNER_JS):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= seconds:
                return
            time.sleep(0.25)
        raise TimeoutError("a loading spinner stayed on the page for 60 s")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))
        log(f"wrote {path} ({path.stat().st_size} bytes)")


PAGE_ERROR_JS = """(() => {
  const text = document.body ? document.body.innerText : '';
  for (const marker of ['Unexpected GraphQL error', 'Something went wrong', 'An unexpected error',
                        'Page not found', 'Asset not found', 'PythonError']) {
    if (text.includes(marker)) return text.slice(0, 400);
  }
  return '';
})()"""

SPINNER_JS = """(() => {
  if (/Loading/.test(document.body ? document.body.innerText : '')) return true;
  // Caption-sized spinners are status icons (a check still running in the latest run), not loading data.
  return [...document.querySelectorAll('[class*="spinner" i]')].some((el) => {
    const box = el.getBoundingClientRect();
    return box.height >= 16 && box.bottom > 0 && box.top < window.innerHeight;
  });
})()"""

LAG_HEIGHT = 1100
"""Tall enough for the Metadata heading, its toggles and three rows of plots, the third holding ``lag``."""


def plot_drawn_js(label: str) -> str:
    """Whether the plot headed ``label`` is drawn."""
    return PLOT_DRAWN_JS.replace("LABEL", json.dumps(label))


PLOT_DRAWN_JS = """(() => {
  const heading = [...document.querySelectorAll('span, h3, h4, div')]
    .find((el) => el.childElementCount === 0 && el.textContent === LABEL);
  let cell = heading;
  while (cell && !cell.querySelector('canvas')) cell = cell.parentElement;
  const canvas = cell && cell.querySelector('canvas');
  if (!canvas || canvas.width < 100 || canvas.height < 50) return false;
  // Drawn: enough pixels of the line's blue (chart.js draws axes and grid in greys).
  const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let blue = 0;
  for (let i = 0; i < pixels.length; i += 4) {
    if (pixels[i + 3] > 200 && pixels[i + 2] > 150 && pixels[i] < 140 && pixels[i + 1] < 140) blue++;
  }
  return blue > 300;
})()"""

LAG_PLOT_DRAWN_JS = plot_drawn_js("lag")


def scroll_to_js(label: str) -> str:
    """Scroll the element that reads ``label`` (a heading) to the top; false while there is none."""
    return f"""(() => {{
  const heading = [...document.querySelectorAll('span, h2, h3, h4, div')]
    .find((el) => el.childElementCount === 0 && el.textContent === {json.dumps(label)});
  if (!heading) return false;
  heading.scrollIntoView({{block: 'start'}});
  return true;
}})()"""


SCROLL_TO_METADATA_JS = scroll_to_js("Metadata")


def has_buttons_js(*labels: str) -> str:
    return f"""(() => {{
  const texts = new Set([...document.querySelectorAll('button')].map((b) => b.innerText.trim()));
  return {json.dumps(list(labels))}.every((label) => texts.has(label));
}})()"""


def skip_community_dialog(page: Page, dev: DagsterDev) -> None:
    """``dagster dev`` on localhost greets a new browser with a newsletter dialog; its Skip button stores this key."""
    page.goto(dev.url)
    page.wait_until("the UI", "document.readyState === 'complete' && !!window.localStorage")
    page.evaluate("window.localStorage.setItem('communityNux', JSON.stringify('1'))")


def click_button_js(label: str) -> str:
    return f"""(() => {{
  const button = [...document.querySelectorAll('button')].find((b) => b.innerText.trim() === {json.dumps(label)});
  if (!button) return false;
  button.click();
  return true;
}})()"""


@contextlib.contextmanager
def chromium(work: Path) -> Iterator[Page]:
    profile = work / "chromium-profile"
    profile.mkdir()
    command = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WIDTH},{HEIGHT}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    if os.geteuid() == 0:
        command.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    with (work / "chromium.log").open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    log(f"chromium pid {proc.pid}")
    try:
        port_file = profile / "DevToolsActivePort"

        def port() -> int | None:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}; see {work / 'chromium.log'}")
            lines = port_file.read_text().split() if port_file.exists() else []
            return int(lines[0]) if lines else None

        devtools = wait_for("chromium's DevTools port", port, 60, 0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{devtools}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        target = next(t for t in targets if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            page = Page(ws)
            page.call("Page.enable")
            page.call(
                "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False
            )
            yield page
    finally:
        stop_group(proc, 10)


def capture_runs(page: Page, dev: DagsterDev, out: Path) -> None:
    """The runs list filtered to successful runs: each a member's run over its shards' ranges, with its
    ``streamgroup/*`` tags (group and member) and launching sensor."""
    page.goto(f"{dev.url}/runs?" + urllib.parse.urlencode({"q[]": "status:SUCCESS"}))
    page.wait_until(
        "the runs list",
        """(() => {
          const text = document.body.innerText;
          return text.split('streamgroup/member:').length > 3 && text.includes('streamgroup/group:')
            && text.includes('Status is')
            && text.includes('clickstream_member');
        })()""",
    )
    page.settle()
    page.screenshot(out / "runs.png")


def capture_materialization(page: Page, dev: DagsterDev, data: Progress, out: Path) -> None:
    """The Events tab with the latest materialization selected (``time=`` selects it), its metadata shown."""
    latest = max(data.lag_points, key=lambda m: float(m["timestamp"]))
    query = urllib.parse.urlencode({"view": "events", "time": latest["timestamp"]})
    page.goto(f"{dev.url}/assets/{ASSET}?{query}")
    partition = json.dumps(f"Partition {latest['partition']}")
    page.wait_until(
        "the materialization's metadata",
        f"""(() => {{
          const text = document.body.innerText;
          return text.includes({partition}) && text.includes('materialized in run')
            && ['shard', 'committed', 'member', 'lag', 'records'].every((k) => text.includes(k));
        }})()""",
    )
    page.settle()
    page.screenshot(out / "materializations.png")


def capture_lag(page: Page, dev: DagsterDev, out: Path) -> None:
    """The asset's Overview tab, Metadata section, Plots, by partition: ``lag`` after each range's commit.

    The plots are React state behind two toggles, not a URL, so they are clicked. By partition, each point is
    the latest materialization of one shard's partition: each shard's lag after its latest commit."""
    page.goto(f"{dev.url}/assets/{ASSET}?view=overview")
    page.wait_until("the Metadata section of the overview", has_buttons_js("Table", "Plots"))
    page.wait_until("the Plots toggle", click_button_js("Plots"))
    page.wait_until("the Partitions toggle of the plots", click_button_js("Partitions"))
    page.wait_until("the lag plot", LAG_PLOT_DRAWN_JS)
    page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=LAG_HEIGHT, deviceScaleFactor=1, mobile=False)
    page.wait_until("the Metadata heading at the top", SCROLL_TO_METADATA_JS)
    page.settle()
    page.wait_until("the lag plot, after scrolling", LAG_PLOT_DRAWN_JS)
    page.screenshot(out / "lag.png")


def capture_lag_over_time(page: Page, dev: DagsterDev, out: Path) -> None:
    """The same Metadata section, Plots, by event: each metadata key over time. The members' lag reports
    (observations every 30 s) carry ``seconds_behind <shard>`` and ``lag <shard>``, so each shard has a plot of its
    seconds behind and one of its records behind over the run; the capture starts at ``seconds_behind``, the largest
    of each event, followed by each shard's."""
    page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
    page.goto(f"{dev.url}/assets/{ASSET}?view=overview")
    page.wait_until("the Metadata section of the overview", has_buttons_js("Table", "Plots"))
    page.wait_until("the Plots toggle", click_button_js("Plots"))
    page.wait_until("the Events toggle of the plots", click_button_js("Events"))
    # ``seconds_behind`` (the materializations' and the reports' largest) is a line; each shard's plot is a point per
    # report, as the events between them do not carry its key: the drawn check reads the line.
    seconds = "seconds_behind"
    page.wait_until(f"the {seconds} plot", scroll_to_js(f"{seconds} {FIRST_SHARD}"))
    page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=LAG_HEIGHT, deviceScaleFactor=1, mobile=False)
    page.wait_until(f"the {seconds} plot drawn", plot_drawn_js(seconds))
    page.wait_until(f"the {seconds} plot at the top", scroll_to_js(seconds))
    page.settle()
    page.wait_until(f"the {seconds} plot, after scrolling", plot_drawn_js(seconds))
    page.screenshot(out / "lag_over_time.png")


def capture(dev: DagsterDev, data: Progress, work: Path, out: Path) -> None:
    shots = work / "screenshots"
    shots.mkdir()
    with chromium(work) as page:
        skip_community_dialog(page, dev)
        try:
            capture_runs(page, dev, shots)
            capture_materialization(page, dev, data, shots)
            capture_lag(page, dev, shots)
            capture_lag_over_time(page, dev, shots)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(work / "failed-page.png")
            raise
    for name in NAMES:
        shutil.move(shots / name, out / name)
        log(f"{name} -> {out / name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--rate", type=int, default=300, help="clickstream events per second")
    parser.add_argument("--min-ranges", type=int, default=48, help="materialized ranges (lag points) to wait for")
    parser.add_argument(
        "--min-reports", type=int, default=8, help=f"lag reports of {FIRST_SHARD} (points over time) to wait for"
    )
    parser.add_argument("--timeout", type=float, default=1200.0, help="give up waiting after this many seconds")
    parser.add_argument("--spark", choices=["connect", "local"], default="connect")
    parser.add_argument("--lock", default="", help="a file to hold an exclusive flock on during the run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) after success")
    args = parser.parse_args(argv)
    if args.rate < 1 or args.min_ranges < 2 or args.min_reports < 2:
        parser.error("--rate must be >= 1, --min-ranges and --min-reports >= 2 (a plot needs points)")
    if not Path(CHROMIUM).exists():
        parser.error(f"{CHROMIUM} is missing (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="streamgroup-screenshots-"))
    keep = args.keep
    try:
        with cpu_lock(args.lock):
            started = time.monotonic()
            log(f"working in {work}")
            with example(work, args) as dev:
                data = wait_for_data(dev, args.min_ranges, args.min_reports, args.timeout)
                capture(dev, data, work, args.out)
            log(f"done in {time.monotonic() - started:.0f} s")
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
