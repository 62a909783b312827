"""Screenshot a page of the MLflow UI in headless Chromium (the README's UI figure; a UI check).

    python scripts/ui_screenshot.py "http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning" \
        --out docs/img/ui_sweep.png --expand --close-assistant

Talks to Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
separated by NUL bytes on fds 3/4), so it needs nothing but the `chromium` binary. --expand
clicks every "expand" button of the runs table (nested child runs); --close-assistant closes
the MLflow Assistant side panel. Prints the page's visible text to stdout (for checks).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any


def _onto_3_4(read_fd: int, write_fd: int) -> None:
    """In the child: the pipe ends on fds 3 and 4 (via fds >= 10, so they cannot clobber)."""
    high_r, high_w = fcntl.fcntl(read_fd, fcntl.F_DUPFD, 10), fcntl.fcntl(write_fd, fcntl.F_DUPFD, 10)
    os.dup2(high_r, 3)
    os.dup2(high_w, 4)


class Chromium:
    def __init__(self, width: int, height: int) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        if binary is None:
            raise FileNotFoundError("no chromium binary (apt-get install chromium)")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # the child expects the read end on fd 3 and the write end on fd 4
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: _onto_3_4(to_child_r, from_child_w),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# the runs table's expand toggle of a parent run (a "+" icon button in the run-name cell)
EXPAND_JS = """(() => { let n = 0;
  for (const b of document.querySelectorAll('button[data-component-id*="runnamecellrenderer"]')) {
    if (b.querySelector('path[d^="M7.25 7.25V4.5"]')) { b.click(); n++; } }
  return n; })()"""
CLICK_JS = """(() => { const want = %s;
  const hits = [...document.querySelectorAll('*')].filter(
      e => e.childElementCount === 0 && (e.textContent || '').trim() === want);
  const el = hits.length ? (hits[0].closest('[role=tab], button, a') || hits[0]) : null;
  if (el) { el.click(); return el.outerHTML.slice(0, 200); } return false; })()"""
CLOSE_ASSISTANT_JS = """(() => {
  const head = [...document.querySelectorAll('*')].find(e => e.childElementCount < 3 &&
      /^MLflow Assistant/.test(e.textContent || ''));
  let box = head; for (let i = 0; box && i < 6; i++, box = box.parentElement) {
    const btns = [...box.querySelectorAll('button')];
    const close = btns.find(b => /close/i.test(b.getAttribute('aria-label') || ''));
    if (close) { close.click(); return true; } }
  return false; })()"""


def screenshot(url: str, out: Path, width: int = 1500, height: int = 900, wait: float = 8.0,
               expand: bool = False, close_assistant: bool = False, click: str | None = None,
               until: str | None = None) -> str:
    """Save a PNG of ``url``; returns the page's visible text.

    ``until``: wait (up to ``wait`` seconds) for this text to appear instead of a fixed wait.
    """
    chrome = Chromium(width, height)
    try:
        target = chrome.call("Target.createTarget", url="about:blank")["targetId"]
        chrome.session = chrome.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        chrome.call("Page.enable")
        chrome.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                    deviceScaleFactor=1, mobile=False)
        chrome.call("Page.navigate", url=url)
        if until:
            end = time.time() + wait
            while time.time() < end and until not in str(chrome.js("document.body.innerText")):
                time.sleep(0.5)
            time.sleep(1.0)  # let the rest of the page settle
        else:
            time.sleep(wait)
        if close_assistant:
            chrome.js(CLOSE_ASSISTANT_JS)
            time.sleep(1.0)
        if click:  # e.g. a tab: "Model metrics"
            chrome.js(CLICK_JS % json.dumps(click))
            time.sleep(wait / 2)
        if expand:
            for _ in range(3):  # a parent's children render after its row expands
                if not chrome.js(EXPAND_JS):
                    break
                time.sleep(1.5)
        shot = chrome.call("Page.captureScreenshot", format="png")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))
        return str(chrome.js("document.body.innerText") or "")
    finally:
        chrome.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--width", type=int, default=1500)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--wait", type=float, default=8.0, help="seconds for the page to load")
    ap.add_argument("--expand", action="store_true")
    ap.add_argument("--close-assistant", action="store_true")
    ap.add_argument("--click", default=None, help="click the element with this text (a tab)")
    a = ap.parse_args()
    print(screenshot(a.url, a.out, a.width, a.height, a.wait, a.expand, a.close_assistant, a.click))


if __name__ == "__main__":
    main()
