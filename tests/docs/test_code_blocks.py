"""Every code block of the guide that claims to run (its fence says ``run``: ```` ```bash run````,
```` ```python run````) runs as written.

The run blocks of one page form one script, in page order, in a fresh empty folder: bash blocks
each in ``bash -euo pipefail``, python blocks in one namespace (a later block may use what an
earlier one made). A leading ``pip install ... &&`` is the set-up the suite already has and is
left out (CI runs the README's install commands themselves)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.docs.markdown import ROOT, Block, blocks, guide_files

PAGES = [p for p in guide_files() if any(b.runs for b in blocks(p))]
LANGUAGES = ("bash", "sh", "console", "python", "py")


def without_install(text: str) -> str:
    """The command with a leading ``pip install ... &&`` (the suite's own set-up) removed."""
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("pip install") and "&&" in line:
            line = line.split("&&", 1)[1].lstrip()
        elif line.lstrip().startswith("pip install"):
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def driver(runnable: list[Block]) -> str:
    """One Python script that runs `runnable` in order (module docstring)."""
    out = ["import subprocess, sys", "namespace = {'__name__': '__main__'}"]
    for block in runnable:
        where = f"{block.page.relative_to(ROOT)}:{block.line}"
        out.append(f"print('--- {where}', flush=True)")
        if block.language in ("python", "py"):
            out.append(f"exec(compile({block.text!r}, {where!r}, 'exec'), namespace)")
        else:
            command = without_install(block.text)
            out.append(
                f"subprocess.run(['bash', '-euo', 'pipefail', '-c', {command!r}], check=True)"
            )
    return "\n".join(out) + "\n"


def test_the_guide_has_runnable_blocks_and_names_their_language():
    assert ROOT / "README.md" in PAGES
    for page in guide_files():
        for block in blocks(page):
            if block.runs:
                assert block.language in LANGUAGES, f"{page}:{block.line}: {block.info!r}"


def test_without_install_keeps_the_job():
    assert without_install("pip install -q torch==2.13.0 -e . && shardtok inspect x\n") == (
        "shardtok inspect x\n"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_runnable_block_runs(page, tmp_path):
    script = tmp_path / "blocks.py"
    script.write_text(driver([b for b in blocks(page) if b.runs]))
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:])
