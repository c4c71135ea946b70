"""Every relative link in README.md, docs/ and benchmarks/ resolves: the file exists and, with
an anchor, so does the heading (GitHub's anchors)."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from tests.docs.markdown import ROOT, anchors, guide_files, links

EXTERNAL = ("http://", "https://", "mailto:", "ftp://")


def broken_links(page) -> list[str]:
    out = []
    for line, target in links(page):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        resolved = page if not path else (page.parent / unquote(path)).resolve()
        where = f"{page.relative_to(ROOT)}:{line}: {target}"
        if not resolved.exists():
            out.append(f"{where} (no such file)")
        elif not resolved.is_relative_to(ROOT):
            out.append(f"{where} (outside the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            out.append(f"{where} (no heading makes #{anchor})")
    return out


@pytest.mark.parametrize("page", guide_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_checker_sees_a_broken_link_and_anchor(tmp_path, monkeypatch):
    import tests.docs.test_links as module

    page = tmp_path / "page.md"
    page.write_text(
        "# A title\n\n## Second `part`\n\n[ok](#a-title) [ok](#second-part) [bad](#nowhere) "
        "[gone](missing.md) `[not a link](x.md)`\n\n```\n[in code](y.md)\n```\n"
    )
    monkeypatch.setattr(module, "ROOT", tmp_path)
    assert broken_links(page) == [
        "page.md:5: #nowhere (no heading makes #nowhere)",
        "page.md:5: missing.md (no such file)",
    ]
