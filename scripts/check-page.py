#!/usr/bin/env python3
"""Drives ferry's page in a headless Chromium over the Chrome DevTools protocol (used by
scripts/check-page.sh): waits for the placement strip and the model picker, sends one chat
message through the page's form, waits for the streamed answer to finish, checks it is a
non-empty answer and not an error, and saves a screenshot of the page.

Usage: check-page.py DEVTOOLS_PORT SCREENSHOT_PNG MESSAGE
Needs the `websocket-client` module (Debian: python3-websocket)."""

import base64
import json
import sys
import time
import urllib.request

import websocket


class Page:
    def __init__(self, port):
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, what, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.25)
        raise SystemExit(f"check-page: timed out waiting for {what}")


def main():
    port, screenshot, message = sys.argv[1], sys.argv[2], sys.argv[3]
    page = Page(port)
    layers = page.wait_for(
        "document.querySelectorAll('.strip span').length", "the placement strip", 60)
    print(f"check-page: the placement strip shows {layers} layers")
    page.wait_for("document.getElementById('model').options.length", "the model picker", 30)
    page.eval(
        "document.getElementById('message').value = " + json.dumps(message) + ";"
        "document.getElementById('send-form').requestSubmit(); true")
    done = page.wait_for(
        "(document.querySelector('.msg.assistant') || {dataset: {}}).dataset.done",
        "the streamed answer", 180)
    answer = page.eval("document.querySelector('.msg.assistant').textContent")
    if done != "true" or not answer.strip():
        raise SystemExit(f"check-page: no answer ({done}): {answer!r}")
    print(f"check-page: streamed answer: {answer!r}")
    # One more status poll so the live numbers include the chat.
    time.sleep(2)
    height = page.eval("document.documentElement.scrollHeight")
    page.call("Emulation.setDeviceMetricsOverride", width=1280, height=max(800, int(height)),
              deviceScaleFactor=1, mobile=False)
    shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    with open(screenshot, "wb") as out:
        out.write(base64.b64decode(shot["data"]))
    print(f"check-page: screenshot in {screenshot}")


if __name__ == "__main__":
    main()
