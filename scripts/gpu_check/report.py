"""Result rows of a GPU check and the report rendered from them.

Every step appends rows (step, metric, value, goal, verdict, note) to ``results.jsonl`` in the
output folder, one JSON object per line, and the markdown table ``gpu-check.md`` and
``gpu-check.json`` are rewritten after each row, so a run that is killed keeps what it measured.

Library: ``append_row``, ``set_meta``, ``render``, ``load_rows``.
CLI (used by scripts/gpu-check.sh):
    report.py add OUT STEP METRIC VALUE [--goal G] [--verdict V] [--note N]
    report.py meta OUT KEY=VALUE...
    report.py render OUT
    report.py table OUT          # print the markdown table to stdout
"""

import argparse
import json
import os
import sys
import time

RESULTS = "results.jsonl"
META = "meta.json"
VERDICTS = ("PASS", "FAIL", "INFO", "SKIP", "ERROR")


def _write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_rows(out_dir):
    """The rows appended so far, in order (a torn last line is ignored)."""
    rows = []
    try:
        with open(os.path.join(out_dir, RESULTS), encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def load_meta(out_dir):
    try:
        with open(os.path.join(out_dir, META), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def set_meta(out_dir, **items):
    """Merges ``items`` into meta.json and re-renders."""
    meta = load_meta(out_dir)
    meta.update(items)
    _write_atomic(os.path.join(out_dir, META), json.dumps(meta, indent=2) + "\n")
    render(out_dir)


def append_row(out_dir, step, metric, value, goal="-", verdict="INFO", note="", data=None):
    """Appends one result row and re-renders the report.

    ``value`` may be a number, a string or None; ``data`` is extra detail kept in the JSON only.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
    row = {
        "step": step,
        "metric": metric,
        "value": value,
        "goal": goal,
        "verdict": verdict,
        "note": note,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if data is not None:
        row["data"] = data
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, RESULTS), "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    render(out_dir)
    print(f"  [{verdict}] {step}: {metric} = {fmt(value)}" + (f"  ({note})" if note else ""),
          flush=True)


def fmt(value):
    """A value as the table shows it: floats rounded to what the measurement supports."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "NaN"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        if magnitude == 0:
            return "0"
        return f"{value:.3g}"
    return str(value)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows):
    lines = [
        "| step | metric | value | goal | verdict | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.get("step", ""), r.get("metric", ""), fmt(r.get("value")), r.get("goal", "-"),
                 r.get("verdict", ""), r.get("note", "")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render(out_dir):
    """Rewrites gpu-check.md and gpu-check.json from meta.json and results.jsonl."""
    rows = load_rows(out_dir)
    meta = load_meta(out_dir)
    counts = {v: sum(1 for r in rows if r.get("verdict") == v) for v in VERDICTS}
    head = ["# ferry GPU check", ""]
    for key in sorted(meta):
        head.append(f"- {key}: {meta[key]}")
    head.append("- verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items() if n))
    head.append("")
    md = "\n".join(head) + "\n" + table(rows)
    _write_atomic(os.path.join(out_dir, "gpu-check.md"), md)
    doc = {"meta": meta, "verdicts": counts, "rows": rows}
    _write_atomic(os.path.join(out_dir, "gpu-check.json"), json.dumps(doc, indent=2) + "\n")


def _number(text):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("out")
    a.add_argument("step")
    a.add_argument("metric")
    a.add_argument("value")
    a.add_argument("--goal", default="-")
    a.add_argument("--verdict", default="INFO", choices=VERDICTS)
    a.add_argument("--note", default="")
    m = sub.add_parser("meta")
    m.add_argument("out")
    m.add_argument("items", nargs="+", metavar="KEY=VALUE")
    r = sub.add_parser("render")
    r.add_argument("out")
    t = sub.add_parser("table")
    t.add_argument("out")
    args = p.parse_args(argv)
    if args.cmd == "add":
        append_row(args.out, args.step, args.metric, _number(args.value), args.goal,
                   args.verdict, args.note)
    elif args.cmd == "meta":
        items = {}
        for item in args.items:
            key, sep, value = item.partition("=")
            if not sep:
                p.error(f"{item!r} is not KEY=VALUE")
            items[key] = _number(value)
        set_meta(args.out, **items)
    elif args.cmd == "render":
        render(args.out)
    else:
        rows = load_rows(args.out)
        sys.stdout.write(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
