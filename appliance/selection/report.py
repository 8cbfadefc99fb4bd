"""The selection decision as a table a person reads (``appliance explain``, ``appliance tune``)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_selection"]


def _number(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_selection(decision: dict[str, Any]) -> str:
    lines = [
        f"model {decision.get('model')} version {decision.get('version')}: "
        f"{decision.get('status', 'measured')}, chosen {decision.get('chosen') or 'the config default'} "
        f"(objective {decision.get('objective', '-')}, cache {decision.get('cache', '-')}, "
        f"hardware {str(decision.get('hardware_fingerprint', '-'))[:16]})",
    ]
    if decision.get("tuned_on"):
        shapes = "; ".join(f"batch {p['batch']} {p['shapes']}" for p in decision.get("profile") or [])
        lines.append(f"tuned on {decision['tuned_on']} inputs: {shapes}")
    for refused in decision.get("inputs_refused") or []:
        lines.append(f"refused {refused['inputs']}: {refused['reason'][:120]}")
    if decision.get("reason"):
        lines.append(decision["reason"])
    if decision.get("fix"):
        lines.append(f"To fix: {decision['fix']}")
    rows = [("plan", "status", "latency ms (b=1)", "items/s (max b)", "max abs err", "reason")]
    for c in decision.get("candidates", []):
        error = c.get("max_abs_error")
        rows.append((
            ("* " if c["plan"] == decision.get("chosen") else "  ") + c["plan"],
            c["status"],
            _number(c.get("latency_ms"), 3),
            _number(c.get("throughput"), 1),
            "-" if error is None else f"{error:.2g}",
            (c.get("reason") or "")[:70],
        ))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    return "\n".join(lines)
