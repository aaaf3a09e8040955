"""The docs hold together: the README stays a front page, every relative link and anchor in the
README and docs/ resolves, every "race N" / "invariant N" cited in the code exists in
docs/design.md's numbered lists, and docs/testing.md's index of where each command and feature
is tested names every command and only test files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    # The two commands that work on a fresh clone; the second is CI's own entry point, which
    # installs everything the suite needs and runs it.
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]' && .venv/bin/mover demo" in text
    assert "```sh\nbash .ci/run\n```" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test]'" in ci and "python -m pytest -q" in ci and "apt-get install" in ci
    assert "Python 3.11" in text


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: link to missing {target}"
        if anchor:
            assert anchor in anchors(dest), f"{doc.name}: no heading for #{anchor} in {dest.name}"


def numbered(section: str) -> set[int]:
    text = (ROOT / "docs" / "design.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", body, re.M)}


def test_design_numbers_its_invariants_and_races():
    assert numbered("Invariants") == set(range(1, 17))
    assert numbered("Races") == set(range(1, 11))


def test_code_cites_only_numbers_that_exist():
    known = {"invariant": numbered("Invariants"), "race": numbered("Races")}
    cited = 0
    for path in [*ROOT.glob("mover/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        for kind, n in re.findall(r"\b(invariant|race)s? (\d+)\b", path.read_text(), re.I):
            cited += 1
            assert int(n) in known[kind.lower()], f"{path.relative_to(ROOT)} cites {kind} {n}"
    assert cited > 5


def _testing_index() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    return text.split("## Where each command and feature is tested\n", 1)[1].split("\n## ", 1)[0]


def _cli_commands() -> set[str]:
    """Every command `mover --help` lists, a sub-command with its group's name (`plan check`)."""
    import typer

    from mover import cli

    out: set[str] = set()

    def walk(group, prefix: str) -> None:
        for name, command in group.commands.items():
            if command.hidden:
                continue
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                out.add(prefix + name)

    walk(typer.main.get_command(cli.app), "")
    return out


def test_the_testing_index_names_every_command_and_only_test_files_that_exist():
    """docs/testing.md's index of where each command and feature is tested cannot rot: one row per
    command `mover --help` lists (and none for a command gone), every row naming test files, each
    of which exists."""
    index = _testing_index()
    commands = _cli_commands()
    assert {"run", "plan check", "set", "partitions maintain"} <= commands, commands
    rows = re.findall(r"^\| (.+?) \| (.+) \|$", index, re.M)
    listed = {m.group(1) for first, _ in rows if (m := re.fullmatch(r"`mover ([a-z -]+)`", first))}
    assert listed == commands, f"rows for no command: {sorted(listed - commands)}; " \
                               f"commands without a row: {sorted(commands - listed)}"
    features = [first for first, _ in rows if not first.startswith("`mover ") and first not in ("command", "feature")]
    assert len(features) >= 20, features
    for first, cell in rows:
        if first in ("command", "feature"):
            continue
        files = re.findall(r"`(tests/[\w/]+\.py)`", cell)
        assert files, f"the row {first!r} names no test file"
        for f in files:
            assert (ROOT / f).is_file(), f"docs/testing.md lists {f} for {first!r}: no such file"
    cited = set(re.findall(r"`(tests/[\w/]+\.py)`", index))
    assert all(re.fullmatch(r"tests/(unit|integration|e2e)/test_\w+\.py|tests/test_\w+\.py", f) for f in cited), cited
