"""The docs hold together: every relative link in README.md and docs/ resolves (a file, and a
heading for a ``#fragment``; no page links to itself by name), docs/slurm.md's table gives
each Slurm habit a test that exists (``file::test`` names a test in that file), and so does each
rule of docs/security.md, where every finding of issue 36 has its row."""

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


def _security_rows() -> list[str]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## What one member cannot do to the others", 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("| rule |"))
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| rule |", "| --- |"))]
    assert len(rows) >= 30
    return rows


def test_each_security_row_names_tests_that_exist_and_issue_36_has_every_finding():
    """docs/security.md's rules: each names at least one test (``file.py::test_name…``, or a
    name alone; ``…`` ends a prefix) that exists, and each of issue 36's findings (numbered as
    the page says) has its row."""
    tests = {p: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    findings: set[int] = set()
    for row in _security_rows():
        cited = re.findall(r"`((?:[\w/.-]+\.py)?(?:::)?)(test_\w+)(…?)`", row.split(" | ")[-1])
        assert cited, f"no test for: {row[:80]}"
        for where, name, prefix in cited:
            file = where.removesuffix("::").rsplit("/", 1)[-1]
            pattern = rf"^def {name}" + ("" if prefix else r"\(")
            assert any(re.search(pattern, t, flags=re.M) for p, t in tests.items()
                       if not file or p.name == file), (where, name)
        for label in re.findall(r"\(issue 36, ([\d, and]+)\)", row.split(" | ")[0]):
            findings |= {int(n) for n in re.findall(r"\d+", label)}
    assert findings == set(range(1, 19)), sorted(set(range(1, 19)) - findings)


def test_multi_node_gives_the_gcs_firewall_rule():
    """Issue 36, 17: the GCS listens on every interface whatever the head's address; the page
    says so and gives the rule a lab adds."""
    text = (ROOT / "docs" / "multi-node.md").read_text()
    assert "listens\n  on every interface (`0.0.0.0:6379`)" in text or "on every interface (`0.0.0.0:6379`)" in text
    assert re.search(r"nft add rule inet filter input tcp dport 6379", text)
    assert re.search(r"iptables -A INPUT -p tcp --dport 6379", text)
