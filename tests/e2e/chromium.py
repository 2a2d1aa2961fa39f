"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
set a cookie, open a page, read its DOM, take a screenshot. No extra packages, no port."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless browser with one page. Commands are JSON messages ended by NUL, written
    to the browser's fd 3; answers and events come back on its fd 4."""

    def __init__(self, binary: str, width: int = 1400, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="cdclake-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # the browser reads commands on fd 3 and answers on fd 4: a shell moves the pipe
        # ends there, closes the originals and becomes the browser
        moves = [f"3<&{to_child_r}", f"4>&{from_child_w}"]
        moves += [f"{fd}<&-" for fd in (to_child_r, from_child_w) if fd not in (3, 4)]
        wire = 'exec "$@" ' + " ".join(moves)
        self.proc = subprocess.Popen(
            [
                "bash", "-c", wire, "chromium", binary,
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-dev-shm-usage", "--remote-debugging-pipe", "--hide-scrollbars",
                f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.send("Page.enable", session=True)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict | None = None, session: bool = False, timeout=30.0
    ) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send(
            "Network.setCookie",
            {"url": url, "name": name, "value": value, "httpOnly": True},
            session=True,
        )

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        return result["result"].get("value")

    def screenshot(self, path: Path) -> bytes:
        data = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
            session=True,
        )["data"]  # fmt: skip
        png = base64.b64decode(data)
        path.write_bytes(png)
        return png

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
