"""What ``grpo plugins`` shows and does: the installed table, conformance checks, scaffolds."""

from __future__ import annotations

from grpo_core.registry import registry

COLUMNS = ("kind", "name", "distribution", "version", "description")


def listing() -> list[dict]:
    """Every registered plugin as {kind, name, distribution, version, description}."""
    return [{"kind": p.kind, "name": p.name, "distribution": p.distribution,
             "version": p.version, "description": p.description} for p in registry().all()]


def table(rows: list[dict]) -> str:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in COLUMNS}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
