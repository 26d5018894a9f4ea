"""The docs hold together: every relative link in README.md and docs/ resolves (a file, and a
heading for a ``#fragment``; no page links to itself by name), and docs/slurm.md's table gives
each Slurm habit a test that exists (``file::test`` names a test in that file)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_resolves():
    bad = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if path and dest == page.resolve():
                bad.append(f"{page.relative_to(ROOT)}: links to itself by name ({target})")
            elif not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} does not exist")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: no heading #{fragment} in {path or 'itself'}")
    assert bad == []


def test_each_slurm_row_names_a_test_that_exists():
    rows = [line for line in (ROOT / "docs" / "slurm.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| Slurm |", "| --- |"))]
    assert len(rows) >= 35
    for row in rows:
        cited = re.findall(r"`(tests/[\w/.-]+\.py)(?:::(\w+))?`", row.split("|")[-2])
        assert cited, f"no test for: {row}"
        for path, name in cited:
            assert (ROOT / path).exists(), path
            if name:
                assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M), (path, name)
