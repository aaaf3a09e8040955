"""Print the tables of bench/README.md from the committed raw results, the newest of each kind.

    .venv/bin/python -m bench.report [bench/results/NAME.json ...]

Every figure in bench/README.md and the README's benchmark section comes from a file in
bench/results/, written by the run that measured it (its command is in the file); this script
renders them again, so a figure can be traced to its run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import RESULTS

KINDS = {"backfill": "bench.backfill", "reconcile": "bench.reconcile", "capture": "bench.capture",
         "scaling": "bench.scaling", "partition": "bench.partition", "cutover": "bench.cutover"}


def newest() -> list[Path]:
    """The newest file of each kind and shape (names: KIND[-SHAPE]-YYYYmmdd-HHMMSS.json)."""
    latest: dict[str, Path] = {}
    for p in sorted(RESULTS.glob("*.json")):
        latest[p.stem.rsplit("-", 2)[0]] = p  # sorted by time within a kind: the last one wins
    return list(latest.values())


def render(path: Path) -> str:
    import importlib
    kind = path.stem.split("-")[0]
    if kind not in KINDS:
        return f"## {path.name}\n\n(no renderer for {kind})"
    r = json.loads(path.read_text())
    text = importlib.import_module(KINDS[kind]).report(r)
    return f"## {path.name}\n\n`{r.get('command', kind)}`\n\n{text}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    for path in args.files or newest():
        print(render(path) + "\n")


if __name__ == "__main__":
    main()
