"""Rendering a stats snapshot: table, csv, json, prometheus; and ``stats diff`` of two CSVs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from rucio_fs.errors import InvalidInput

from .stats import flatten, quantile

FORMATS = ("table", "csv", "json", "prometheus")


def render(snap: Mapping[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(snap, indent=2, sort_keys=True)
    if fmt == "csv":
        return to_csv(flatten(snap))
    if fmt == "prometheus":
        from rucio_fs.observe import metrics  # prometheus_client: only for this format

        return metrics.render(snap)
    return to_table(snap)


def _value(value: float | str | bool) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def to_csv(flat: Mapping[str, float | str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["metric", "value"])
    for name, value in flat.items():
        writer.writerow([name, _value(value)])
    return out.getvalue().rstrip("\n")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def to_table(snap: Mapping[str, Any]) -> str:
    lines = [f"rucio-fs {snap.get('version', '?')}  {snap.get('url', '')} on "
             f"{snap.get('mountpoint', '')}  pid {snap.get('pid', '?')}  "
             f"fuse connection {snap.get('kernel', {}).get('fuse_connection', '?')}",
             f"interval: {snap['now'] - snap['since']:.1f} s"]
    for section, title in (("fuse", "FUSE operations"), ("backend", "backend calls")):
        ops = snap.get(section, {})
        lines += ["", f"{title:<14} {'count':>9} {'errors':>7} {'mean ms':>9} {'p50 ms':>9} "
                      f"{'p99 ms':>9} {'max ms':>9} {'bytes':>13} {'at once':>7}"]
        for name, data in ops.items():
            hist = data["latency"]
            if not hist["count"]:
                continue
            errors = sum(data["errors"].values())
            lines.append(
                f"{name:<14} {hist['count']:>9} {errors:>7} "
                f"{_ms(hist['total_ns'] / hist['count']):>9} {_ms(quantile(hist, 0.5)):>9} "
                f"{_ms(quantile(hist, 0.99)):>9} {_ms(hist['max_ns']):>9} {data['bytes']:>13} "
                f"{data.get('peak', 0):>7}")
            if errors:
                lines.append(f"{'':<14} errors: " + ", ".join(
                    f"{k}={v}" for k, v in sorted(data["errors"].items())))
    lines += ["", f"{'cache layer':<14} {'on':>3} {'hits':>10} {'misses':>10} {'hit %':>7}"]
    for layer, counters in snap.get("cache", {}).items():
        hits, misses = counters.get("hits", 0), counters.get("misses", 0)
        ratio = f"{100 * hits / (hits + misses):.1f}" if hits + misses else "-"
        lines.append(f"{layer:<14} {'yes' if counters.get('enabled', 1) else 'no':>3} "
                     f"{hits:>10} {misses:>10} {ratio:>7}")
    shared = {k: v for k, v in snap.get("cache", {}).get("shared", {}).items()
              if k not in ("hits", "misses", "enabled")}
    if shared:  # lease waits, takeovers, errors, bypassed calls, bytes
        lines.append("shared: " + ", ".join(f"{k}={v}" for k, v in sorted(shared.items())))
    for section in ("coalesced", "events", "backend_counters", "sizes", "inodes"):
        values = snap.get(section) or {}
        if values:
            lines.append("")
            lines.append(f"{section}: " + ", ".join(f"{k}={v}" for k, v in sorted(values.items())))
    identities = snap.get("identities") or {}
    if identities:  # a per-user mount: counters per local uid
        lines.append("")
        lines.append("identities (uid): " + "; ".join(
            f"{uid} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items()))
            for uid, c in identities.items()))
    config = snap.get("config", {})
    if config:
        lines += ["", "config: " + ", ".join(f"{k}={_value(v)}" for k, v in config.items())]
    return "\n".join(lines)


def read_csv(path: str) -> dict[str, str]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    if not rows or rows[0] != ["metric", "value"]:
        raise InvalidInput(f"{path}: not a rucio-fs stats CSV (header must be 'metric,value')")
    return {row[0]: row[1] for row in rows[1:] if len(row) == 2}


def diff(path_a: str, path_b: str, everything: bool = False) -> str:
    """Per-metric difference B - A, largest relative changes first, flagged by size."""
    a, b = read_csv(path_a), read_csv(path_b)
    rows = []
    for name in sorted(set(a) | set(b)):
        va, vb = a.get(name, "0"), b.get(name, "0")
        try:
            fa, fb = float(va), float(vb)
        except ValueError:
            if va != vb:
                rows.append((float("inf"), name, va, vb, "changed", "!!!"))
            continue
        if fa == fb and not everything:
            continue
        delta = fb - fa
        rel = abs(delta) / abs(fa) if fa else (float("inf") if delta else 0.0)
        flag = "!!!" if rel >= 1 else "!!" if rel >= 0.25 else "!" if rel >= 0.05 else ""
        rel_text = "new" if not fa and delta else f"{100 * delta / fa:+.1f}%" if fa else "0%"
        rows.append((rel, name, va, vb, f"{delta:+g} ({rel_text})", flag))
    rows.sort(key=lambda r: (-r[0], r[1]))
    width = max([len(r[1]) for r in rows] + [6])
    lines = [f"{'metric':<{width}}  {'A':>14}  {'B':>14}  change"]
    lines += [f"{name:<{width}}  {va:>14}  {vb:>14}  {change} {flag}".rstrip()
              for _, name, va, vb, change, flag in rows]
    if not rows:
        lines.append("(no differences)")
    return "\n".join(lines)
