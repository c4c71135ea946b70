"""What the docs tests read from Markdown: fenced code blocks, relative links and the anchors
GitHub makes of headings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def guide_files() -> list[Path]:
    """README.md and every Markdown page of docs/ and benchmarks/."""
    pages = [ROOT / "README.md"]
    for folder in ("docs", "benchmarks"):
        pages += sorted((ROOT / folder).rglob("*.md"))
    return [p for p in pages if ".bench" not in p.parts]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str  # the fence's info string: language, then words such as "run"
    text: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runs(self) -> bool:
        """A block whose info string says ``run`` claims to run as written: the suite runs it."""
        return "run" in self.info.split()[1:]


def blocks(page: Path) -> list[Block]:
    out, lines = [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, fence, info = opened.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        out.append(Block(page, i + 1, info.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return out


def prose_lines(page: Path, *, strip_code: bool = True) -> list[tuple[int, str]]:
    """The page's lines outside fenced code (inline code removed: where links live)."""
    out, fence = [], None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(line)
        if opened and fence is None:
            fence = opened.group(2)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        out.append((number, INLINE_CODE.sub("", line) if strip_code else line))
    return out


def links(page: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in prose_lines(page) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[`*_]", "", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub makes on `page` (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page, strip_code=False):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    out |= set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    return out
