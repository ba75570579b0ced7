"""The documentation site: `mkdocs build --strict` (what `make docs` runs) succeeds, and the
generated pages hold what they must: every `marble` subcommand, every path and operation
of the OpenAPI document the broker serves, and the files the pages include."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from marbled.api.openapi import SPEC
from marbled.cli.client_cmd import main as marble
from tests import REPO

pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def text(markup: str) -> str:
    """What a reader sees: the page's article without tags (code highlighting included)."""
    article = markup[markup.index("<article"):markup.index("</article>")]
    return html.unescape(re.sub(r"<[^>]+>", "", article))


def test_every_page_is_built_and_no_marker_or_hook_is_left(site):
    for source in (REPO / "docs").glob("*.md"):
        built = site / "index.html" if source.stem == "index" else site / source.stem / "index.html"
        assert built.is_file(), f"{source.name} was not built"
        assert "<!-- include" not in built.read_text() and "<!-- openapi" not in built.read_text()
    assert not (site / "hooks.py").exists()


def test_the_cli_page_has_marbled_and_every_marble_subcommand(site):
    markup = page(site, "cli")
    shown = text(markup)
    assert 'id="marbled"' in markup and "marbled [OPTIONS]" in shown
    assert marble.commands, "no marble subcommands"
    for name in marble.commands:
        assert f'id="marble-{name}"' in markup, f"marble {name} has no section"
        assert f"marble {name} [OPTIONS]" in shown, f"marble {name} has no usage"


def test_the_api_page_has_every_path_and_operation_of_the_served_document(site):
    shown = text(page(site, "api"))
    for path, item in SPEC["paths"].items():
        assert path in shown, f"{path} is missing"
        for method in item:
            assert f"{method.upper()} {path}" in shown, f"{method.upper()} {path} is missing"
    for name in SPEC["components"]["schemas"]:
        assert f"\n{name}" in shown
    served = json.loads((site / "openapi.json").read_text())
    assert served == json.loads(json.dumps(SPEC))


def test_included_files_are_on_their_pages(site):
    hooks = _hooks()
    readme = (REPO / "jobscripts" / "README.md").read_text()
    section = hooks.markdown_section(readme, "making-your-own-script-suspendable")
    assert section and section.strip()
    first = section.strip().splitlines()[0]
    assert first in text(page(site, "training-scripts"))
    staff = text(page(site, "staff-guide"))
    for sql in ("schema.sql", "reports.sql"):
        for line in (REPO / "sql" / sql).read_text().splitlines():
            assert line.strip() in staff, f"sql/{sql}: {line!r} is not on the staff guide"


def test_a_section_ends_at_the_next_heading_of_its_level_not_in_code():
    hooks = _hooks()
    doc = "# T\n\n## A b\n\nx\n\n```sh\n# not a heading\n```\n\n### Sub\n\ny\n\n## Next\n\nz\n"
    expected = "\nx\n\n```sh\n# not a heading\n```\n\n### Sub\n\ny\n"
    assert hooks.markdown_section(doc, "a-b") == expected
    assert hooks.markdown_section(doc, "nope") is None


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_click_paragraphs_kept_as_written_become_text_blocks():
    hooks = _hooks()
    lines = ["Run it.", "", "Examples:", "  marbled --detach   # here", "  marbled --gpus 6", "",
             "Prose that wraps", "over two lines <with id>."]
    assert hooks.click_description(lines) == [
        "Run it.", "",
        "Examples:", "", "```text", "marbled --detach   # here", "marbled --gpus 6", "```", "",
        "Prose that wraps", "over two lines &lt;with id&gt;.", ""]


def test_links_of_an_included_file_are_made_relative_to_the_page():
    hooks = _hooks()
    text = ("[p](../docs/worker-protocol.md#env) [s](train_tf.py) [w](https://x.org/a) "
            "[here](#top)")
    assert hooks.rebase_links(text, REPO / "jobscripts", REPO / "docs") == (
        "[p](worker-protocol.md#env) [s](../jobscripts/train_tf.py) [w](https://x.org/a) "
        "[here](#top)")
