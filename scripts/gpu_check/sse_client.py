"""A stdlib client for ferry's OpenAI completions endpoint that timestamps every streamed token.

``stream_completion`` sends ``stream: true`` with ``logprobs: 0``, which makes ferry emit one SSE
chunk per generated token (text-less tokens included, see crates/ferry-server/src/handlers/completions.rs),
and records ``time.perf_counter()`` when each token chunk arrives. ``decode_rate`` turns one
stream into tokens/s, ``aggregate_rate`` several concurrent streams.
"""

import http.client
import json
import threading
import time


class RequestError(RuntimeError):
    pass


def post_json(port, path, body, timeout=600):
    """A plain (non-streamed) JSON POST; returns the decoded response or raises RequestError."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode(errors="replace")
        if resp.status != 200:
            raise RequestError(f"POST {path} -> {resp.status}: {data[:300]}")
        return json.loads(data)
    finally:
        conn.close()


def stream_completion(port, body, timeout=600):
    """Streams one completion. Returns {"sent", "token_times", "texts", "usage", "finish"}."""
    body = dict(body, stream=True, logprobs=0, stream_options={"include_usage": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    result = {"token_times": [], "texts": [], "usage": None, "finish": None}
    try:
        result["sent"] = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RequestError(f"completions -> {resp.status}: "
                               f"{resp.read().decode(errors='replace')[:300]}")
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RequestError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                result["usage"] = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("logprobs") is not None:
                    result["token_times"].append(now)
                    result["texts"].append(choice.get("text", ""))
                if choice.get("finish_reason"):
                    result["finish"] = choice["finish_reason"]
    finally:
        conn.close()
    if not result["token_times"]:
        raise RequestError(f"no token chunks in the stream (finish {result['finish']})")
    return result


def decode_rate(stream):
    """(tokens - 1) / (last token time - first token time); None with fewer than 2 tokens."""
    times = stream["token_times"]
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def ttft(stream):
    """Seconds from sending the request to the first token chunk."""
    return stream["token_times"][0] - stream["sent"]


def concurrent_streams(port, bodies, timeout=600):
    """Runs one stream per body at once (one thread each); returns the results in order.
    A failed request raises after all threads finish."""
    results = [None] * len(bodies)
    errors = []

    def worker(i, body):
        try:
            results[i] = stream_completion(port, body, timeout)
        except Exception as e:  # noqa: BLE001 - collected and re-raised below
            errors.append(f"request {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i, b), daemon=True)
               for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise RequestError("; ".join(errors[:3]))
    if any(r is None for r in results):
        raise RequestError("a concurrent stream did not finish in time")
    return results


def aggregate_rate(streams):
    """Aggregate decode tokens/s of concurrent streams, counted over the window in which all of
    them were decoding (from the latest first token to the earliest last token), so staggered
    prefills do not count. Falls back to sum(tokens - 1) / (latest last - earliest first) when
    that window is empty. Returns (rate, window_seconds, how)."""
    start = max(s["token_times"][0] for s in streams)
    end = min(s["token_times"][-1] for s in streams)
    if end > start:
        count = sum(1 for s in streams for t in s["token_times"] if start < t <= end)
        if count >= len(streams):
            return count / (end - start), end - start, "all-decoding window"
    first = min(s["token_times"][0] for s in streams)
    last = max(s["token_times"][-1] for s in streams)
    tokens = sum(len(s["token_times"]) - 1 for s in streams)
    if last <= first:
        return None, 0.0, "degenerate"
    return tokens / (last - first), last - first, "first-to-last"
