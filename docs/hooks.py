"""mkdocs hooks (mkdocs.yml `hooks:`): what the site shows but docs/ does not hold.

A page marks a generated part with a block that a Git forge shows as its fallback:

    <!-- openapi -->
    ... what a reader of the bare markdown sees instead ...
    <!-- end openapi -->

    <!-- include ../jobscripts/README.md#making-your-own-script-suspendable -->
    ... a link to the same place, for the forge ...
    <!-- end include -->

At build time the hook replaces the block: `openapi` by the HTTP API reference rendered
from `marbled.api.openapi.SPEC` (the document the broker serves; the site also serves it
as openapi.json), `include PATH[#SECTION]` by that file (a path relative to the page,
as a link would be; SQL and other files as a code block) or by one section of a markdown
file (the heading's anchor; the section's body without its heading). A missing file or
section stops the build.

The CLI reference (docs/cli.md) is mkdocs-click's: `::: mkdocs-click` blocks. Click keeps
a paragraph that follows a `\\b` line as written (examples, command lines); mkdocs-click
drops the `\\b` and leaves the lines to be joined into one paragraph, so `ClickHelp` below
shows such a paragraph's indented lines as a text block instead.
"""

from __future__ import annotations

import html
import json
import os
import re
import textwrap
from pathlib import Path

from markdown.extensions import Extension
from markdown.extensions.toc import slugify
from markdown.preprocessors import Preprocessor
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

from marbled.api.openapi import SPEC

BLOCK = re.compile(r"<!-- (openapi|include)(?: +(\S+))? *-->\n.*?<!-- end \1 -->", re.S)
HEADING = re.compile(r"(#{1,6}) +(.+?) *#*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
METHODS = ("get", "put", "post", "delete", "patch")
LANGUAGES = {".sql": "sql", ".py": "python", ".yaml": "yaml", ".sh": "sh", ".csv": "csv"}


def on_config(config):
    config.markdown_extensions.append(ClickHelp())
    return config


def on_files(files, config):
    """The OpenAPI document itself, next to the page that renders it."""
    files.append(File.generated(config, "openapi.json", content=json.dumps(SPEC, indent=2)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        kind, argument = match.groups()
        if kind == "openapi":
            return render_openapi(SPEC)
        if not argument:
            raise PluginError(f"{page.file.src_uri}: '<!-- include -->' needs a path")
        return include(Path(page.file.abs_src_path).parent, argument, config, page)

    return BLOCK.sub(replace, markdown)


def on_serve(server, config, builder):
    """`mkdocs serve` rebuilds when an included file or the API document changes."""
    root = Path(config.config_file_path).parent
    for path in ("jobscripts/README.md", "sql", "marbled/api/openapi.py"):
        server.watch(str(root / path))
    return server


# -- click help ----------------------------------------------------------------------------


class ClickHelp(Extension):
    def extendMarkdown(self, md) -> None:
        # After mkdocs-click (141) has written the commands' docs, before code blocks (25).
        md.preprocessors.register(ClickHelpProcessor(md), "marbled_click_help", 140)


class ClickHelpProcessor(Preprocessor):
    """In a command's description (from its heading to mkdocs-click's `**Usage:**`), a
    paragraph with indented lines becomes its first line and a text block of the rest;
    prose is escaped, so that `<allocation id>` is shown rather than taken for HTML."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        description: list[str] | None = None
        for line in lines:
            if description is not None and line == "**Usage:**":
                out += click_description(description) + [line]
                description = None
            elif HEADING.match(line):
                out += description or []
                out.append(line)
                description = []
            elif description is not None and FENCE.match(line):
                out += description + [line]  # not a command's description
                description = None
            elif description is not None:
                description.append(line)
            else:
                out.append(line)
        return out + (description or [])


def click_description(lines: list[str]) -> list[str]:
    out: list[str] = []
    for paragraph in "\n".join(lines).split("\n\n"):
        rows = [row for row in paragraph.split("\n") if row.strip()]
        if not any(row[:1].isspace() for row in rows):
            out += [html.escape(row, quote=False) for row in rows] + [""]
            continue
        head = rows[:1] if not rows[0][:1].isspace() else []
        kept = rows[len(head):]
        out += [html.escape(row, quote=False) for row in head]
        if kept:
            out += ["", "```text", *textwrap.dedent("\n".join(kept)).split("\n"), "```"]
        out.append("")
    return out


# -- include -------------------------------------------------------------------------------


def include(base: Path, argument: str, config, page) -> str:
    target, _, section = argument.partition("#")
    path = (base / target).resolve()
    root = Path(config.config_file_path).parent.resolve()
    where = f"{page.file.src_uri}: include {argument}"
    if not path.is_relative_to(root) or not path.is_file():
        raise PluginError(f"{where}: no such file in the repository")
    text = path.read_text()
    if path.suffix == ".md":
        if section:
            text = markdown_section(text, section)
            if text is None:
                raise PluginError(f"{where}: no heading with that anchor in {target}")
        return rebase_links(text, path.parent, base).strip() + "\n"
    if section:
        raise PluginError(f"{where}: only a markdown file has sections")
    fence = "````" if "```" in text else "```"
    return f"{fence}{LANGUAGES.get(path.suffix, '')}\n{text.rstrip()}\n{fence}\n"


def rebase_links(text: str, source: Path, page: Path) -> str:
    """Relative links of an included file, made relative to the page that includes it (a
    link to a page in docs/ then reaches that page; one elsewhere still fails the build)."""

    def rebase(match: re.Match) -> str:
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|[#/]", target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        moved = os.path.relpath(os.path.normpath(source / path), page)
        return f"]({Path(moved).as_posix()}{hash_}{anchor})"

    return re.sub(r"\]\(([^)\s]+)\)", rebase, text)


def markdown_section(text: str, anchor: str) -> str | None:
    """The body of the section whose heading has `anchor` (as GitHub and mkdocs make it),
    up to the next heading of the same or a higher level; None if there is none."""
    lines, body, level, fenced = text.splitlines(), None, 0, False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else HEADING.match(line)
        if body is None:
            if heading and slugify(heading.group(2), "-") == anchor:
                body, level = [], len(heading.group(1))
            continue
        if heading and len(heading.group(1)) <= level:
            break
        body.append(line)
    return None if body is None else "\n".join(body)


# -- openapi -------------------------------------------------------------------------------


def render_openapi(spec: dict) -> str:
    """The API reference as markdown: an index of the operations, each operation, and the
    schemas they refer to."""
    operations = [(path, method, op) for path, item in spec["paths"].items()
                  for method, op in item.items() if method in METHODS]
    out = [f"OpenAPI {spec['openapi']}, *{spec['info']['title']}* version "
           f"{spec['info']['version']}: {spec['info'].get('description', '')} "
           "The whole document: [openapi.json](openapi.json).", "",
           "| method | path | what |", "|---|---|---|"]
    for path, method, op in operations:
        title = f"{method.upper()} {path}"
        out.append(f"| {method.upper()} | [`{path}`](#{slugify(title, '-')}) "
                   f"| {cell(op.get('summary', ''))} |")
    out += ["", "## Operations", ""]
    for path, method, op in operations:
        out += render_operation(path, method, op)
    for kind, members in spec.get("components", {}).items():
        # schemas, and any other kind of component (securitySchemes, ...) under its name
        out += ["## " + ("Schemas" if kind == "schemas" else f"Components: {kind}"), ""]
        for name, member in members.items():
            out += [f"### {name}", ""]
            if member.get("description"):
                out += [member["description"], ""]
            out += json_block(member)
    return "\n".join(out) + "\n"


def render_operation(path: str, method: str, op: dict) -> list[str]:
    out = [f"### {method.upper()} {path}", "", op.get("summary", ""), ""]
    if op.get("description"):
        out += [op["description"], ""]
    parameters = op.get("parameters", [])
    if parameters:
        out += ["**Parameters**", "", "| name | in | required | schema |", "|---|---|---|---|"]
        for p in parameters:
            out.append(f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                       f"| `{json.dumps(p.get('schema', {}))}` |")
        out.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            out += [f"**Request body** ({media}{', required' if body.get('required') else ''})",
                    ""]
            out += json_block(content.get("schema", {}))
            out += schema_links(content.get("schema", {}))
    out += ["**Responses**", "", "| status | description | body |", "|---|---|---|"]
    for status, answer in op.get("responses", {}).items():
        shown = ", ".join(schema_name(c.get("schema", {}))
                          + ("" if media == "application/json" else f" ({media})")
                          for media, c in answer.get("content", {}).items()) or "none"
        if answer.get("headers"):
            shown += "; headers " + ", ".join(f"`{h}`" for h in answer["headers"])
        out.append(f"| {status} | {cell(answer.get('description', ''))} | {shown} |")
    return out + [""]


def schema_name(schema: dict) -> str:
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        return f"[{name}](#{slugify(name, '-')})"
    return f"`{schema.get('type', json.dumps(schema))}`"


def schema_links(schema: dict) -> list[str]:
    refs = sorted(set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(schema))))
    if not refs:
        return []
    return ["Schemas: " + ", ".join(f"[{n}](#{slugify(n, '-')})" for n in refs), ""]


def json_block(value) -> list[str]:
    return ["```json", json.dumps(value, indent=2), "```", ""]


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
