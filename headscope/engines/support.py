"""Which model families each engine scores exactly: the conformance table, as the tests found it.

``headscope/data/support.json`` is written by ``python -m scripts.conformance --write`` (from a
clone: the conformance suite, ``tests/oracles/conformance.py``, is not part of the package), which
scans a tiny random model of every family with every engine and compares each score, chance and n
with the same metrics computed from Hugging Face's own eager attention weights.
``tests/apps/test_conformance.py`` reruns those checks and fails when this file (or the site's table
made from it, :func:`support_markdown`) says anything else, so a family is claimed for an engine
only where the test run showed it exact.

>>> table = load_support()
>>> table["Llama"]["engines"]["blocked"]["status"]
'exact'
>>> support_text(table).splitlines()[0].split()[:4]
['family', 'model_type', 'kind', 'fused']
"""

from __future__ import annotations

import json
from pathlib import Path

SUPPORT_JSON = Path(__file__).parent.parent / "data" / "support.json"


def load_support(path: Path = SUPPORT_JSON) -> dict:
    """``{family: {"model_type", "kind", "note", "engines": {engine: {"status", "detail",
    ...}}}}``."""
    return json.loads(Path(path).read_text())["families"]


def support_meta(path: Path = SUPPORT_JSON) -> dict:
    """How the table was made: the command, transformers' version and the tolerance."""
    doc = json.loads(Path(path).read_text())
    return {k: v for k, v in doc.items() if k != "families"}


def pinned_range(package: str = "transformers") -> str | None:
    """The version range headscope's installed metadata asks for ``package`` (``">=5.25,<5.26"``,
    lower bounds first), or None when headscope is not installed or does not require it."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        reqs = [Requirement(r) for r in requires("headscope") or []]
    except PackageNotFoundError:
        return None
    for req in reqs:
        if req.name.lower().replace("_", "-") == package and req.marker is None:
            specs = sorted(req.specifier, key=lambda s: (s.operator.startswith("<"), s.version))
            return ",".join(str(s) for s in specs) or None
    return None


def installed_version(package: str = "transformers") -> str | None:
    """``package``'s installed version, read from its metadata (no import), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def version_note(meta: dict | None = None, installed: str | None = None) -> str | None:
    """One line when the installed transformers is not the one the table was made with (a family
    marked exact is vouched for only under the version that checked it), else None.

    >>> version_note({"transformers": "5.25.0"}, installed="5.25.0") is None
    True
    >>> version_note({"transformers": "5.25.0"}, installed="5.26.0").split(":")[0]
    'transformers 5.26.0 is installed, but this table was made with 5.25.0'
    """
    made = (support_meta() if meta is None else meta).get("transformers")
    installed = installed_version() if installed is None else installed
    if made is None or installed is None or installed == made:
        return None
    return (
        f"transformers {installed} is installed, but this table was made with {made}: "
        f"'exact' is vouched for only under {made} (check this version from a clone: "
        f"python -m scripts.conformance)"
    )


def support_text(table: dict | None = None) -> str:
    """A plain-text table for ``headscope models --support``: family, each engine's verdict, and
    for every refusal the reason, once per distinct reason."""
    table = load_support() if table is None else table
    engines = list(next(iter(table.values()))["engines"])
    w = max(len(n) for n in table) + 1
    lines = [
        f"{'family':<{w}} {'model_type':<13} {'kind':<8} "
        + " ".join(f"{e:<8}" for e in engines)
        + " notes"
    ]
    for name, row in table.items():
        cells = " ".join(f"{row['engines'][e]['status']:<8}" for e in engines)
        lines.append(
            f"{name:<{w}} {row['model_type']:<13} {row['kind']:<8} {cells} {row['note']}".rstrip()
        )
    reasons: dict[str, list[str]] = {}
    for name, row in table.items():
        for e, o in row["engines"].items():
            if o["status"] != "exact":
                why = o["detail"].replace(f"The {e} engine cannot run here: ", "")
                reasons.setdefault(f"{e}: {why}", []).append(name)
    if reasons:
        lines += ["", "Refused (engine: reason -> families):"]
        lines += [f"  {why} -> {', '.join(fams)}" for why, fams in reasons.items()]
    return "\n".join(lines)


def support_markdown(table: dict) -> str:
    """The support table (Markdown, for the site): one row per family, a column per engine."""
    engines = sorted(
        {e for row in table.values() for e in row["engines"]},
        key=lambda e: list(next(iter(table.values()))["engines"]).index(e),
    )
    mark = {
        "exact": "exact",
        "refused": "refused",
        "wrong": "NOT SUPPORTED (wrong)",
        "error": "NOT SUPPORTED (error)",
    }
    lines = [
        "| family | `model_type` | kind | what the tiny model exercises | "
        + " | ".join(engines)
        + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in engines) + " |",
    ]
    for name, row in table.items():
        cells = [mark[row["engines"][e]["status"]] for e in engines]
        lines.append(
            f"| {name} | `{row['model_type']}` | {row['kind']} | {row['note'] or '-'} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


# How an engine's verdict on a family moved between two tables: a refusal that became exact is an
# improvement; exact that became a refusal, or anything that became wrong or a crash, a regression.
_RANK = {"wrong": 0, "error": 0, "refused": 1, "exact": 2}


def support_changes(old: dict, new: dict) -> dict[str, list[str]]:
    """What changed from table ``old`` to table ``new``, one line per (family, engine), sorted into
    ``improved`` (refused -> exact), ``regressed`` (exact -> refused, or anything -> wrong / error),
    ``reworded`` (the same status, another refusal reason) and ``families`` (added or removed).

    >>> a = {"Falcon": {"engines": {"fused": {"status": "refused", "detail": "no"}}}}
    >>> b = {"Falcon": {"engines": {"fused": {"status": "exact", "detail": ""}}}}
    >>> support_changes(a, b)["improved"]
    ['Falcon / fused: refused -> exact']
    >>> support_changes(b, a)["regressed"]
    ['Falcon / fused: exact -> refused (no)']
    """
    out: dict[str, list[str]] = {"improved": [], "regressed": [], "reworded": [], "families": []}
    for name in old.keys() - new.keys():
        out["families"].append(f"{name}: no longer in the conformance run")
    for name in new.keys() - old.keys():
        out["families"].append(f"{name}: new in the conformance run")
    for name in [n for n in new if n in old]:
        before, after = old[name]["engines"], new[name]["engines"]
        for engine in after:
            a = after[engine]
            b = before.get(engine, {"status": "refused", "detail": "(not run)"})
            line = f"{name} / {engine}: {b['status']} -> {a['status']}"
            if a["status"] != "exact":
                line += f" ({a['detail']})"
            if _RANK[a["status"]] > _RANK[b["status"]]:
                out["improved"].append(line)
            elif a["status"] != b["status"] or _RANK[a["status"]] == 0:
                out["regressed"].append(line)
            elif a["detail"] != b["detail"]:
                out["reworded"].append(f"{line}: was ({b['detail']})")
    return out


def changes_text(changes: dict[str, list[str]]) -> str:
    """``support_changes`` as lines for a person to read before a pin moves."""
    counts = ", ".join(f"{len(v)} {k}" for k, v in changes.items())
    lines = [f"changes against the shipped table: {counts}"]
    for kind, rows in changes.items():
        lines += [f"  {kind}: {row}" for row in rows]
    return "\n".join(lines)
