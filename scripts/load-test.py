#!/usr/bin/env python3
"""Loopback load test of `ferry serve`: a soak, an overload burst, a connection flood and a
burst of oversized prompts, each bounded in time and size. Python standard library only.

It starts its own server on 127.0.0.1 (a free port, a temporary config) from a built binary,
waits for /health, runs the phases and prints one markdown table per phase (what
docs/BENCHMARKS.md records), then stops the server with SIGTERM and reports its exit code.

  scripts/load-test.py                       # the full run (about 3 minutes)
  scripts/load-test.py --smoke               # every phase, small and short (about 30 s)
  scripts/load-test.py --ferry target/release/ferry --model models/X.gguf

Phases:
  soak      N streaming chat clients for D seconds: requests, failures, tokens/s, the gap between
            a stream's events (p50/p99/max), the server's RSS at start and end.
  overload  B requests at once against max_queue Q: how many 503s, how fast they came back, and
            whether each carried Retry-After.
  flood     F idle TCP connections (more than max_connections), then /health on a new one: its
            status and latency, and how many idle sockets the server closed to make room.
  oversized 8 prompts of 10 MB at once: every one a 400, how long they took, RSS before/after.
  long      a ~4,000-token prompt arrives beside S streaming clients, and a short request 1 s
            after it: the streams' gap p99 while the long prompt prefills, and the short one's
            time to first token beside it and alone.
  slowbody  max_connections + 64 connections that send a completion's head and trickle its body
            (a byte a second, re-opened as the server closes them, up to 200 a second) for 30 s, while probes ask
            /v1/models and a short completion: how many probes were answered.
  mix       N clients for D seconds cycling through chat, completions, n=2, tools, json_schema,
            stop, logprobs and clients that disconnect mid-stream, each prompt distinct (prefix
            cache on): failures, and RSS after warm-up, at the end, and its drift per minute
            against ferry_prefix_cache_tokens.

  scripts/load-test.py --phases long,mix     # just some phases
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "smollm2"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def post(port, path, body, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), payload


def get(port, path, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", path)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


class Server:
    def __init__(self, args):
        self.port = free_port()
        self.config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.config.write(
            f"""[server]
host = "127.0.0.1"
port = {self.port}
max_queue = {args.max_queue}
max_connections = {args.max_connections}
shutdown_timeout = "5s"

[[models]]
name = "{MODEL_NAME}"
source = "{os.path.abspath(args.model)}"
max_context = {args.max_context}
max_batch = {args.max_batch}
{args.extra_model_settings}

[models.offload]
mode = "none"
"""
        )
        self.config.close()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        self.process = subprocess.Popen(
            [args.ferry, "serve", "--config", self.config.name, "--device", "cpu"],
            stdout=self.log,
            stderr=self.log,
            env=env,
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"ferry exited early ({self.process.returncode}); log: {self.log.name}")
            try:
                if get(self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        sys.exit("ferry never became healthy")

    def rss(self):
        return rss_bytes(self.process.pid)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.unlink(self.config.name)
        return self.process.returncode


def sse_data_events(response):
    """The `data: ` events of a streamed response, each as it arrives (bytes)."""
    buffer = b""
    while True:
        chunk = response.read1(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                yield event


def stream_chat(port, prompt, max_tokens):
    """One streamed chat completion: (ok, events, gaps between events in seconds)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "stream": True,
        }
    ).encode()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        response.read()
        conn.close()
        return False, 0, []
    gaps, events, last, done = [], 0, None, False
    for event in sse_data_events(response):
        now = time.monotonic()
        if last is not None:
            gaps.append(now - last)
        last = now
        if event == b"data: [DONE]":
            done = True
        elif b'"error"' in event:
            conn.close()
            return False, events, gaps
        else:
            events += 1
    conn.close()
    return done, events, gaps


def soak(server, clients, seconds):
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    totals = {"requests": 0, "failures": 0, "events": 0, "gaps": []}
    prompts = [
        "Write a haiku about the sea.",
        "Explain what a ferry is in two sentences.",
        "List three colours.",
        "What is the capital of France?",
    ]

    def client(i):
        n = 0
        while time.monotonic() < stop_at:
            try:
                ok, events, gaps = stream_chat(server.port, prompts[(i + n) % len(prompts)], 32)
            except OSError:
                ok, events, gaps = False, 0, []
            n += 1
            with lock:
                totals["requests"] += 1
                totals["failures"] += 0 if ok else 1
                totals["events"] += events
                totals["gaps"].extend(gaps)

    rss_start = server.rss()
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    rss_end = server.rss()
    gaps = [g * 1000 for g in totals["gaps"]]
    print(f"\n### soak: {clients} streaming chat clients, {seconds} s\n")
    print("| requests | failures | chunks/s | gap p50 ms | gap p99 ms | gap max ms | RSS start MiB | RSS end MiB |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {totals['requests']} | {totals['failures']} | {totals['events'] / elapsed:.1f} "
        f"| {pct(gaps, 50):.1f} | {pct(gaps, 99):.1f} | {max(gaps, default=float('nan')):.1f} "
        f"| {rss_start / 2**20:.0f} | {rss_end / 2**20:.0f} |"
    )
    return totals["failures"] == 0


def overload(server, burst):
    results = []
    lock = threading.Lock()
    barrier = threading.Barrier(burst)

    def one():
        barrier.wait()
        started = time.monotonic()
        try:
            status, headers, _ = post(
                server.port,
                "/v1/completions",
                {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 16},
            )
            retry = any(k.lower() == "retry-after" for k in headers)
        except OSError:
            status, retry = 0, False
        with lock:
            results.append((status, time.monotonic() - started, retry))

    threads = [threading.Thread(target=one) for _ in range(burst)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r[0] == 200]
    shed = [r for r in results if r[0] == 503]
    other = len(results) - len(ok) - len(shed)
    shed_ms = [r[1] * 1000 for r in shed]
    print(f"\n### overload: {burst} requests at once\n")
    print("| 200 | 503 | other | 503 p50 ms | 503 max ms | 503 with Retry-After |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {len(ok)} | {len(shed)} | {other} | {pct(shed_ms, 50):.1f} "
        f"| {max(shed_ms, default=float('nan')):.1f} | {sum(1 for r in shed if r[2])} |"
    )
    return other == 0 and len(shed) > 0


def flood(server, connections):
    sockets = []
    opened_at = time.monotonic()
    for _ in range(connections):
        try:
            sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        except OSError:
            break
    opened = time.monotonic() - opened_at
    started = time.monotonic()
    try:
        status, _ = get(server.port, "/health", timeout=10)
    except OSError:
        status = 0
    health_ms = (time.monotonic() - started) * 1000
    closed = 0
    for s in sockets:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    print(f"\n### flood: {connections} idle connections\n")
    print("| opened | open s | /health | /health ms | idle closed by the server |")
    print("|---|---|---|---|---|")
    print(f"| {len(sockets)} | {opened:.2f} | {status} | {health_ms:.1f} | {closed} |")
    return status == 200


def oversized(server, count, megabytes):
    prompt = "a" * (megabytes * 1024 * 1024)
    time.sleep(0.5)
    before = server.rss()
    statuses = []
    lock = threading.Lock()

    def one():
        try:
            status, _, _ = post(server.port, "/v1/completions", {"model": MODEL_NAME, "prompt": prompt})
        except OSError:
            status = 0
        with lock:
            statuses.append(status)

    started = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    time.sleep(0.5)
    after = server.rss()
    print(f"\n### oversized: {count} prompts of {megabytes} MB at once\n")
    print("| 400 | other | all answered in s | RSS before MiB | RSS after MiB | after / before |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {statuses.count(400)} | {len(statuses) - statuses.count(400)} | {took:.2f} "
        f"| {before / 2**20:.0f} | {after / 2**20:.0f} | {after / before:.3f} |"
    )
    return statuses.count(400) == count and after / before <= 1.1


def metric(server, name):
    """A metric from /metrics summed over its label sets (0 when absent)."""
    _, payload = get(server.port, "/metrics")
    total = 0.0
    for line in payload.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def first_token_seconds(port, body):
    """Seconds from sending a streamed completion to its first data event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.monotonic()
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)).encode(),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = None
    while True:
        chunk = response.read1(65536)
        if not chunk:
            break
        if first is None and b"data: " in chunk:
            first = time.monotonic() - started
    conn.close()
    return first if first is not None else float("nan")


def long_prompt_words(count):
    words = ["river", "stone", "harbor", "lantern", "copper", "meadow", "signal", "orchard"]
    return " ".join(words[(i * 7 + i // 3) % len(words)] for i in range(count))


def long_beside_streams(server, streams):
    short = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 4}
    alone = min(first_token_seconds(server.port, short) for _ in range(3))
    long_body = {"model": MODEL_NAME, "prompt": long_prompt_words(3900), "max_tokens": 1}
    status, _, payload = post(server.port, "/tokenize", {"model": MODEL_NAME, "prompt": long_body["prompt"]})
    long_tokens = json.loads(payload).get("count", 0) if status == 200 else 0
    stop = threading.Event()
    lock = threading.Lock()
    stamps = []  # (time, stream) of every event of the background streams

    def stream(i):
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            body = {"model": MODEL_NAME, "prompt": f"Story {i}: once upon a time", "max_tokens": 48,
                    "ignore_eos": True, "stream": True}
            conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                         {"Content-Type": "application/json"})
            for _ in sse_data_events(conn.getresponse()):
                with lock:
                    stamps.append((time.monotonic(), i))
            conn.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    time.sleep(3)
    result = {}

    def long_one():
        started = time.monotonic()
        post(server.port, "/v1/completions", long_body, timeout=900)
        result["long"] = (started, time.monotonic())

    long_thread = threading.Thread(target=long_one)
    long_thread.start()
    time.sleep(1)
    beside = first_token_seconds(server.port, short)
    long_thread.join()
    stop.set()
    for t in threads:
        t.join()
    began, ended = result["long"]
    gaps = []
    by_stream = {}
    for at, i in sorted(stamps):
        if began <= at <= ended and i in by_stream and by_stream[i] >= began:
            gaps.append((at - by_stream[i]) * 1000)
        by_stream[i] = at
    print(f"\n### long: a {long_tokens}-token prompt beside {streams} streams\n")
    print("| long prompt s | stream gaps during it | gap p50 ms | gap p99 ms | gap max ms "
          "| short TTFT alone ms | short TTFT beside ms |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {ended - began:.1f} | {len(gaps)} | {pct(gaps, 50):.0f} | {pct(gaps, 99):.0f} "
        f"| {max(gaps, default=float('nan')):.0f} | {alone * 1000:.0f} | {beside * 1000:.0f} |"
    )
    return len(gaps) > 0


def mix_request(port, kind, index):
    """One request of the soak mix; True when it was answered as it should be."""
    # A distinct preamble of about 200 tokens, so every request leaves blocks in the cache.
    words = ["river", "stone", "harbor", "lantern", "copper", "meadow", "signal", "orchard",
             "velvet", "engine", "glacier", "pepper", "summit", "thunder", "window", "ribbon"]
    state = index * 2654435761 % 2**32
    preamble = []
    for _ in range(150):
        state = (state * 1103515245 + 12345) % 2**31
        preamble.append(words[state >> 27])
    unique = f"Request {index} ({kind}): {' '.join(preamble)}."
    if kind == "disconnect":
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = {"model": MODEL_NAME, "prompt": unique + " tell a long story", "max_tokens": 64,
                "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        ok = response.status == 200 and b"data: " in response.read1(65536)
        conn.close()  # gone mid-stream
        return ok
    if kind == "completion":
        path, body = "/v1/completions", {"prompt": unique + " the weather is", "max_tokens": 24}
    elif kind == "n":
        path, body = "/v1/completions", {"prompt": unique + " colours:", "max_tokens": 16, "n": 2,
                                         "temperature": 0.8}
    elif kind == "stop":
        path, body = "/v1/completions", {"prompt": unique + " count: 1, 2, 3,", "max_tokens": 32,
                                         "stop": [","]}
    elif kind == "logprobs":
        path, body = "/v1/completions", {"prompt": unique + " a", "max_tokens": 8, "logprobs": 3}
    else:
        messages = [{"role": "user", "content": unique + " what is the weather in Paris?"}]
        path, body = "/v1/chat/completions", {"messages": messages, "max_tokens": 24}
        if kind == "tools":
            body["tools"] = [{"type": "function", "function": {
                "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}}]
        elif kind == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": {"type": "object",
                                             "properties": {"city": {"type": "string"}},
                                             "required": ["city"]}}}
    status, _, payload = post(port, path, dict(body, model=MODEL_NAME), timeout=300)
    if status != 200 and not FIRST_FAILURE:
        FIRST_FAILURE.append(f"{kind}: {status} {payload[:300]!r}")
    return status == 200


FIRST_FAILURE = []


REOPEN_PER_S = 200


def slow_bodies(server, connections, seconds):
    import selectors
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{")
    selector = selectors.DefaultSelector()
    opened = [0]

    def open_one():
        try:
            s = socket.create_connection(("127.0.0.1", server.port), timeout=2)
            s.sendall(head)
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ)
            opened[0] += 1
        except OSError:
            pass

    for _ in range(connections):
        open_one()
    results = []
    lock = threading.Lock()

    def probe(kind):
        started = time.monotonic()
        try:
            if kind == "models":
                status, _ = get(server.port, "/v1/models", timeout=10)
            else:
                status, _, _ = post(server.port, "/v1/completions",
                                    {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}, timeout=10)
        except OSError:
            status = 0
        with lock:
            results.append((kind, status, time.monotonic() - started))

    probes = []
    closed = [0]
    reopened_at = time.monotonic()
    stop_at = time.monotonic() + seconds
    next_drip = next_probe = time.monotonic()
    n = 0
    while time.monotonic() < stop_at:
        for key, _ in selector.select(timeout=0.05):
            sock = key.fileobj
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                closed[0] += 1
        now = time.monotonic()
        # Re-open what the server closed, at most REOPEN_PER_S a second (an unbounded churn
        # only measures how fast the client runs out of ephemeral ports).
        while closed[0] > 0 and reopened_at + 1 / REOPEN_PER_S <= now:
            closed[0] -= 1
            reopened_at = max(reopened_at + 1 / REOPEN_PER_S, now - 1)
            open_one()
        if now >= next_drip:
            next_drip = now + 1
            for key in list(selector.get_map().values()):
                try:
                    key.fileobj.send(b" ")
                except OSError:
                    pass
        if now >= next_probe:
            next_probe = now + seconds / 40
            t = threading.Thread(target=probe, args=("models" if n % 2 == 0 else "completion",))
            t.start()
            probes.append(t)
            n += 1
    for t in probes:
        t.join()
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    by_kind = {k: [r for r in results if r[0] == k] for k in ("models", "completion")}
    print(f"\n### slowbody: {connections} connections trickling request bodies, {seconds} s\n")
    print("| connections opened | /v1/models answered | completions answered | probe p50 ms | probe max ms |")
    print("|---|---|---|---|---|")
    ok_ms = [r[2] * 1000 for r in results if r[1] == 200]
    print(
        f"| {opened[0]} | {sum(r[1] == 200 for r in by_kind['models'])}/{len(by_kind['models'])} "
        f"| {sum(r[1] == 200 for r in by_kind['completion'])}/{len(by_kind['completion'])} "
        f"| {pct(ok_ms, 50):.0f} | {max(ok_ms, default=float('nan')):.0f} |"
    )
    return all(r[1] == 200 for r in results)


MIX = ["chat", "completion", "n", "tools", "json_schema", "stop", "logprobs", "disconnect"]


def mix(server, clients, seconds):
    warm_until = time.monotonic() + min(20, seconds / 4)
    stop_at = time.monotonic() + seconds
    lock = threading.Lock()
    counts = {kind: [0, 0] for kind in MIX}  # kind: [requests, failures]
    samples = []
    counter = [0]

    def client(i):
        while time.monotonic() < stop_at:
            with lock:
                counter[0] += 1
                index = counter[0]
            kind = MIX[index % len(MIX)]
            try:
                ok = mix_request(server.port, kind, index)
            except OSError:
                ok = False
            with lock:
                counts[kind][0] += 1
                counts[kind][1] += 0 if ok else 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() < stop_at:
        time.sleep(5)
        samples.append((time.monotonic() - started, server.rss(), metric(server, "ferry_prefix_cache_tokens")))
    for t in threads:
        t.join()
    after_warm = [x for x in samples if x[0] >= warm_until - started] or samples
    first, last = after_warm[0], samples[-1]
    minutes = max((last[0] - first[0]) / 60, 1e-9)
    drift = (last[1] - first[1]) / 2**20 / minutes
    failures = sum(c[1] for c in counts.values())
    requests = sum(c[0] for c in counts.values())
    print(f"\n### mix: {clients} clients, {seconds} s, prefix cache on\n")
    print("| requests | failures | " + " | ".join(MIX) + " |")
    print("|---|---|" + "---|" * len(MIX))
    print(f"| {requests} | {failures} | " + " | ".join(f"{c[0]}/{c[1]}" for c in counts.values()) + " |")
    print("\n| RSS after warm-up MiB | RSS end MiB | RSS max MiB | drift MiB/min "
          "| cached tokens after warm-up | cached tokens end |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {first[1] / 2**20:.0f} | {last[1] / 2**20:.0f} | {max(x[1] for x in samples) / 2**20:.0f} "
        f"| {drift:.1f} | {first[2]:.0f} | {last[2]:.0f} |"
    )
    if FIRST_FAILURE:
        print(f"\nfirst failure: {FIRST_FAILURE[0]}")
    return failures == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ferry", default=os.path.join(ROOT, "target/release/ferry"))
    parser.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--smoke", action="store_true", help="every phase, small and short")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument("--max-queue", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-connections", type=int, default=256)
    parser.add_argument("--flood", type=int, default=0, help="idle connections (default 4 x max-connections)")
    parser.add_argument("--max-context", type=int, default=8192)
    parser.add_argument("--streams", type=int, default=3, help="streams beside the long prompt")
    parser.add_argument("--mix-seconds", type=int, default=180)
    parser.add_argument("--model-setting", action="append", default=[],
                        help="extra line for the [[models]] table, e.g. 'step_time = \"0\"'")
    parser.add_argument("--phases", default="soak,overload,flood,oversized,slowbody,long,mix")
    args = parser.parse_args()
    args.extra_model_settings = "\n".join(args.model_setting)
    phases = set(args.phases.split(","))
    if args.smoke:
        args.clients, args.seconds, args.burst, args.mix_seconds = 4, 10, 32, 30
        args.max_connections = min(args.max_connections, 64)
    flood_size = args.flood or 4 * args.max_connections
    if not os.path.isfile(args.ferry):
        sys.exit(f"{args.ferry} is missing: cargo build --release (or pass --ferry)")
    server = Server(args)
    print(f"ferry on 127.0.0.1:{server.port}, pid {server.process.pid}, log {server.log.name}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    passed = {}
    try:
        if "soak" in phases:
            passed["soak"] = soak(server, args.clients, args.seconds)
        if "overload" in phases:
            passed["overload"] = overload(server, args.burst)
        if "flood" in phases:
            passed["flood"] = flood(server, flood_size)
        if "oversized" in phases:
            passed["oversized"] = oversized(server, 8, 10)
        if "long" in phases:
            passed["long"] = long_beside_streams(server, args.streams)
        if "mix" in phases:
            passed["mix"] = mix(server, args.clients, args.mix_seconds)
        if "slowbody" in phases:
            passed["slowbody"] = slow_bodies(server, args.max_connections + 64, 30)
    finally:
        code = server.stop()
    print(f"\nserver exit code after SIGTERM: {code}")
    print("phases: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in passed.items()))
    sys.exit(0 if all(passed.values()) and code == 0 else 1)


if __name__ == "__main__":
    main()
