"""The README is for users: short, with the details in docs/ (issue 35). Every relative link of the
README, docs/ and tests/README.md resolves to a file of the repo (and an in-page anchor to a heading
of that page), and the README stays within 200 lines."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}


def test_the_readme_is_at_most_200_lines_and_points_into_docs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md: keep it for users (<= 200 lines); move details to docs/"
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(text) if t.startswith("docs/")}
    assert linked == {p.name for p in DOCS}, f"docs/ pages the README does not link (or links that are not pages): " \
                                             f"{sorted(linked ^ {p.name for p in DOCS})}"


@pytest.mark.parametrize("page", [REPO / "README.md", REPO / "tests" / "README.md", *DOCS],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)
