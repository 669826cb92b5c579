"""The documentation site (mkdocs.yml over docs/) builds in strict mode: no broken link or anchor, no page left out of
the nav. Needs mkdocs (the `docs` and `dev` extras); skipped, saying so, without it."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (or '.[dev]')")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, cwd=REPO, timeout=300)


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_docs_site_builds_strictly_with_every_page_in_its_nav(tmp_path):
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    built = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    pages = _nav_pages(config["nav"])
    assert sorted(pages) == sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))
    for page in pages:
        html = "index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html"
        html = html.replace("/index/index.html", "/index.html")
        assert (tmp_path / "site" / html).is_file(), html


@pytest.mark.parametrize("damage", ["page outside the nav", "broken link", "broken anchor"])
def test_the_strict_build_fails_on_a_page_outside_the_nav_or_a_broken_link(tmp_path, damage):
    """The check above can fail: mkdocs.yml's settings over a two-page site with one fault each do not build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the other page](other.md#a-section).\n", encoding="utf-8")
    (docs / "other.md").write_text("# Other\n\n## A section\n", encoding="utf-8")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Other": "other.md"}])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert _build(tmp_path / "mkdocs.yml", tmp_path / "site").returncode == 0  # sound as written
    if damage == "page outside the nav":
        (docs / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    elif damage == "broken link":
        (docs / "index.md").write_text("# Home\n\nSee [a page](no_such_page.md).\n", encoding="utf-8")
    else:
        (docs / "index.md").write_text("# Home\n\nSee [a section](other.md#no-such-section).\n", encoding="utf-8")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "strict mode" in built.stderr + built.stdout
