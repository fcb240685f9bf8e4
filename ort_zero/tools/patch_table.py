"""docs/patches.md's table of every replaced symbol, written from the declarations in `ort_zero.patches`, so that a
patch's reason is written once (tests/unit/tools/test_patch_table.py fails when the page and the declarations differ).

    python -m ort_zero.tools.patch_table --write docs/patches.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import patches

BEGIN = "<!-- generated from ort_zero/patches by `python -m ort_zero.tools.patch_table --write docs/patches.md` -->"
END = "<!-- end of the generated table -->"


def table() -> str:
    """One row per patch, in each group's order: the group, what it replaces, the versions it was written for, why;
    after a patch, a row for each op symbolic or gradient its replacement registers."""
    rows = ["| group | replaced | written for | why |", "|---|---|---|---|"]
    for group, declared in patches.groups().items():
        for patch in declared:
            owner = patch.owner_path.replace(":", ".")
            written_for = f"{patch.distribution} {patch.versions}"
            rows.append(f"| {group} | `{owner}.{patch.attribute}` | {written_for} | {_cell(patch.reason)} |")
            for registered in patch.registers:
                needed = f" (needed by {', '.join(registered.needed_by)})" if registered.needed_by else ""
                why = _cell(registered.reason + needed)
                rows.append(f"| {group} | `{registered.target}`, through `{patch.name}` | {written_for} | {why} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def with_table(page: str) -> str:
    """`page` with the text between its markers replaced by today's table."""
    head, found, rest = page.partition(BEGIN)
    if not found or END not in rest:
        raise ValueError(f"the page has no generated table (markers {BEGIN!r} ... {END!r})")
    return f"{head}{BEGIN}\n{table()}\n{END}{rest.partition(END)[2]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="the page whose generated table to replace (else: print the table)")
    args = parser.parse_args(argv)
    if args.write is None:
        print(table())
        return
    args.write.write_text(with_table(args.write.read_text()))


if __name__ == "__main__":
    main()
