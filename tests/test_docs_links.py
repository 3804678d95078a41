"""Every relative link in README.md and docs/ points at a file of the
repository (and at a heading of it, where it names one), and every
recorded benchmark result the docs cite is committed."""

import re
import subprocess

import pytest

from tests.harness import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITED_RESULT = re.compile(r"`(benchmarks/results/[\w./-]+)`")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def committed() -> set[str]:
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(listing.split())


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    files = committed()
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        relative = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else None
        if path and relative not in files and not resolved.is_dir():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: {relative} has no heading #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_cited_result_is_committed(page):
    files = committed()
    missing = [path for path in CITED_RESULT.findall(page.read_text()) if path not in files]
    assert not missing, f"{page.name} cites {missing}, which are not in the repository"


def test_links_and_anchors_are_read_as_github_does():
    assert LINK.findall("see [the guide](docs/install.md#with-spack) and ![a plot](results/a.png)") == \
        ["docs/install.md#with-spack", "results/a.png"]
    assert slug("Checking a job before it trains: `torch-mojo doctor`") == \
        "checking-a-job-before-it-trains-torch-mojo-doctor"
