"""Every relative link in README, CHANGELOG and docs/ points at a file that exists, and a link
into a Markdown file's #anchor points at a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from docs_markdown import ROOT, anchors_of, github_anchor, markdown_files, prose_lines

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`[^`]*`")
EXTERNAL = ("http://", "https://", "mailto:")


def links(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    found = []
    for number, line in prose_lines(text):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            found.append((number, match.group(1)))
    return found


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = []
    for number, target in links(path):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
            problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_anchor_rules() -> None:
    assert github_anchor("dpone ledger status") == "dpone-ledger-status"
    assert github_anchor("dpone.error.v1") == "dponeerrorv1"
    assert github_anchor("DPONE_PACK_MISMATCH") == "dpone_pack_mismatch"
    assert github_anchor("Roll back to `internal`") == "roll-back-to-internal"
    assert github_anchor("What / why (ten lines)") == "what--why-ten-lines"
