"""Helpers of the documentation tests: which Markdown files are the docs, and how GitHub
turns a heading into an anchor."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```|~~~)")


def markdown_files() -> list[Path]:
    """README, CHANGELOG and every Markdown file under docs/ (others' pages included)."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.exists()]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def github_anchor(heading: str) -> str:
    """GitHub's heading slug: lower-case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings (with GitHub's -1, -2 for repeats) and
    explicit <a id|name="..."> tags."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    text = path.read_text(encoding="utf-8")
    for _, line in prose_lines(text):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = github_anchor(match.group(2))
            n = seen.get(slug, 0)
            anchors.add(slug if n == 0 else f"{slug}-{n}")
            seen[slug] = n + 1
    anchors.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return anchors
