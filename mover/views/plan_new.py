"""`mover plan new` as output: the plan file written (or the plan on stdout, nothing else there),
and on stderr what it holds and the command to run next. An existing file is refused before the
database is asked anything, and again when it is created (exclusively), unless --force."""

from __future__ import annotations

from pathlib import Path

from mover.errors import BadInput
from mover.names import display_ident
from mover.plan.writer import Draft
from mover.views.console import Consoles, say


def destination(output: str | None, force: bool) -> Path | None:
    """The file to write (None: stdout, for no -o or `-o -`)."""
    if output is None or output == "-":
        return None
    path = Path(output)
    if path.exists() and not force:
        raise BadInput(f"{output} exists already; mover plan new writes a new file",
                       hint=f"name another file with -o, or add --force to overwrite {output}")
    return path


def written(con: Consoles, draft: Draft, path: Path | None, force: bool) -> None:
    text = draft.text()
    if path is None:
        con.out.file.write(text)  # as it is: rich would wrap or style it
        con.out.file.flush()
    else:
        try:
            with path.open("w" if force else "x", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            raise BadInput(f"{path} exists already; mover plan new writes a new file",
                           hint=f"name another file with -o, or add --force to overwrite {path}") from None
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror}", hint="check the path and its directory") from None
    changes = [", ".join(f"{display_ident(c)} as {t}" for c, t in draft.columns.items())] if draft.columns else []
    changes += ["partitioned by " + str(draft.partition["by"])] if draft.partition else []
    say(con.err, f"{'wrote ' + str(path) if path else 'the plan'}: migration {draft.name!r} moves {draft.source} "
                 f"({'; '.join(changes) or 'same shape'})")
    for table in draft.also:
        say(con.err, f"  and [[also]] {table.source}: "
                     f"{', '.join(f'{display_ident(c)} as {t}' for c, t in table.columns.items())}")
    say(con.err, f"next: `mover plan check {path or 'PLAN'}` says what it will do; `mover run {path or 'PLAN'}` "
                 f"starts it")
