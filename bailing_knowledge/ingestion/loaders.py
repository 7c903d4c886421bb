"""Turn files into documents: a title, a plain-text body and a little metadata.

Everything downstream (hashing, revisions, chunk offsets, search) works on one `str` body, so
each format is reduced to text here, once:

* `.txt` — UTF-8 (a byte-order mark is honoured, also UTF-16's); title = file stem.
* `.md`, `.markdown` — the Markdown source as is (headings stay visible to the chunker);
  title = front-matter `title:`, else the first level-1 heading, else the first heading,
  else the file stem.
* `.html`, `.htm` — visible text only (stdlib `html.parser`): no scripts, styles or head;
  blocks become paragraphs, list items and table rows become lines, headings become
  Markdown `#` lines so the chunker sees them; title = `<title>`, else the first `<h1>`.
* `.pdf` — text per page via the optional `pypdf` (`pip install "bailing-knowledge[pdf]"`);
  title = the PDF's own title metadata, else the file stem.

Every body then gets the same normalisation: newlines become `\\n`, NUL characters (which
PostgreSQL text cannot store) and unpaired surrogates are removed; nothing else changes.
A file that yields no text is an error, not an empty document.

Failures raise `LoaderError`, whose message names the file (never a full machine path) and
the reason, so a command can print it and carry on with the next file.

Hosts add formats with `register_loader(".rst", load_rst)`; `discover` walks directories
and reports which files have a loader.
"""

from __future__ import annotations

import codecs
import io
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import regex

from ..markdown import code_block, escape_line_start, find_headings, front_matter_end
from .library_log import collected_records, distinct_messages

__all__ = [
    "SUPPORTED_SUFFIXES",
    "TITLE_MAX_CHARS",
    "Discovered",
    "LoadedDocument",
    "Loader",
    "LoaderError",
    "discover",
    "get_loader",
    "html_to_text",
    "iter_files",
    "load_file",
    "load_html",
    "load_markdown",
    "load_pdf",
    "load_text",
    "markdown_title",
    "normalize_text",
    "register_loader",
    "supported_suffixes",
    "unregister_loader",
]

# Document.title is a CharField(max_length=500).
TITLE_MAX_CHARS = 500


@dataclass(frozen=True)
class LoadedDocument:
    """What a loader makes of a file: the input of `upsert_document`.

    `metadata` always has `content_type` (e.g. "text/markdown"); `load_file` adds
    `source_path`, the file's source key (relative path), never an absolute path.
    """

    title: str
    body: str
    metadata: dict[str, Any] = field(default_factory=dict)


class LoaderError(Exception):
    """A file could not be turned into a document.

    The message is safe to show and to log: the file's name or source key and a reason,
    never its content or where it lives on the machine.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}")


Loader = Callable[[Path], LoadedDocument]
"""A loader reads the file at the given path and returns its title, body and metadata.

It raises `LoaderError` for anything it cannot read; `load_file` applies the common
normalisation (newlines, NUL, title fallback) to whatever it returns.
"""

_LOADERS: dict[str, Loader] = {}


def _normalize_suffix(suffix: str) -> str:
    """Canonical registry key: ".RST" and "rst" become ".rst". One suffix, not ".tar.gz"."""
    key = suffix.strip().lower()
    if not key.startswith("."):
        key = "." + key
    if len(key) < 2 or key.count(".") != 1 or any(ch in key for ch in "/\\ "):
        raise ValueError(f"not a file suffix: {suffix!r}")
    return key


def register_loader(suffix: str, loader: Loader, *, replace: bool = False) -> None:
    """Use `loader` for files ending in `suffix` (case-insensitive, e.g. ".rst").

    Registering a suffix that already has a loader is an error unless `replace=True`, so
    two apps cannot silently fight over one format. Register from an `AppConfig.ready()`.
    """
    key = _normalize_suffix(suffix)
    if key in _LOADERS and not replace:
        raise ValueError(f"a loader for {key!r} is already registered; pass replace=True")
    _LOADERS[key] = loader


def unregister_loader(suffix: str) -> None:
    """Forget the loader for `suffix`; files with it are reported as unsupported."""
    _LOADERS.pop(_normalize_suffix(suffix), None)


def get_loader(path: Path | str) -> Loader | None:
    """The loader for a file name (by its last suffix, case-insensitive), or None."""
    suffix = Path(path).suffix.lower()
    return _LOADERS.get(suffix) if suffix else None


def supported_suffixes() -> frozenset[str]:
    """The suffixes that currently have a loader: the built-ins plus registered ones."""
    return frozenset(_LOADERS)


# --- Text normalisation ---------------------------------------------------------------------

_NEWLINES = re.compile(r"\r\n?")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_GRAPHEME = regex.compile(r"\X")


def storable_text(text: str) -> str:
    """`text` without NUL and unpaired surrogates, which PostgreSQL text and UTF-8 cannot
    hold."""
    return _UNSTORABLE.sub("", text)


def normalize_text(text: str) -> str:
    """Newlines as `\\n`, and `storable_text`. Everything else is kept as is."""
    return storable_text(_NEWLINES.sub("\n", text))


_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")


def _clean_title(title: str) -> str:
    """One line, no surrounding space or control character, at most TITLE_MAX_CHARS (cut
    between graphemes)."""
    title = " ".join(_CONTROL_CHARACTER.sub(" ", normalize_text(title)).split())
    if len(title) <= TITLE_MAX_CHARS:
        return title
    end = 0
    for match in _GRAPHEME.finditer(title):
        if match.end() > TITLE_MAX_CHARS:
            break
        end = match.end()
    return title[:end].rstrip()


def load_file(
    path: Path, *, source_key: str | None = None, root: Path | None = None
) -> LoadedDocument:
    """Load one file with the loader registered for its suffix.

    `source_key` (the file's key in its knowledge base, e.g. "guides/setup.md") names the
    file in errors and in `metadata["source_path"]`; it defaults to the file name. The title
    falls back to the file stem when the loader finds none. `root` is the directory the file
    was found under: a file that resolves outside it (a symbolic link to /etc/passwd, say),
    or to a hidden file or directory inside it (`.env`), is refused, checked here rather
    than when the tree was listed, so that a link made in between is caught too. Raises
    `LoaderError`.
    """
    path = Path(path)
    name = source_key or path.name
    loader = get_loader(path)
    if loader is None:
        raise LoaderError(name, f"unsupported file type {path.suffix or '(no suffix)'!r}")
    if storable_text(name) != name:  # the surrogates of a name's bytes that are not UTF-8
        raise LoaderError(name, "its name is not UTF-8 text: rename the file")
    if root is not None:
        target, top = path.resolve(), Path(root).resolve()
        if not target.is_relative_to(top):
            raise LoaderError(name, "links outside the directory being ingested (not read)")
        if any(_hidden(part) for part in target.relative_to(top).parts):
            # The walk skips hidden files (.env, .git/...); a link must not reach them either.
            raise LoaderError(name, "links to a hidden file or directory (not read)")
    if not path.is_file():
        raise LoaderError(name, "not a readable file")
    try:
        loaded = loader(path)
    except LoaderError as exc:
        if exc.name == name:
            raise
        raise LoaderError(name, exc.reason) from exc
    except OSError as exc:
        raise LoaderError(name, f"cannot be read ({exc.strerror or type(exc).__name__})") from exc
    except Exception as exc:
        # A host's loader failed in a way it did not anticipate: keep the message safe.
        raise LoaderError(name, f"could not be loaded ({type(exc).__name__})") from exc
    body = normalize_text(loaded.body)
    if not body.strip():
        raise LoaderError(name, "no text")
    title = _clean_title(loaded.title) or _clean_title(path.stem) or name
    metadata = dict(loaded.metadata)
    metadata["source_path"] = name
    return LoadedDocument(title=title, body=body, metadata=metadata)


# --- Plain text and Markdown ----------------------------------------------------------------

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: it starts with the same bytes
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def _decode(data: bytes, name: str, *, fallback: str = "utf-8") -> str:
    """Decode by byte-order mark, else as `fallback` (UTF-8 unless a format declares
    otherwise). Undecodable bytes are an error: silently replacing them would index
    garbage and hide a wrong encoding from whoever maintains the files."""
    encoding, skipped = fallback, 0
    for bom, bom_encoding in _BOMS:
        if data.startswith(bom):
            data, encoding, skipped = data[len(bom) :], bom_encoding, len(bom)
            break
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        label = "UTF-8" if encoding == "utf-8" else encoding
        offset = skipped + exc.start  # in the file, as a hex editor shows it
        raise LoaderError(
            name, f"not valid {label} text (undecodable byte at offset {offset})"
        ) from exc
    except LookupError as exc:  # pragma: no cover - encodings are checked before use
        raise LoaderError(name, f"unknown text encoding {encoding!r}") from exc


def load_text(path: Path) -> LoadedDocument:
    """A plain-text file: the body is the text; the title is left to the file stem."""
    body = _decode(path.read_bytes(), path.name)
    return LoadedDocument(title="", body=body, metadata={"content_type": "text/plain"})


_FRONT_MATTER_TITLE = re.compile(r"^title[ \t]*:(?:[ \t]+(.*?))?[ \t]*$", re.MULTILINE)
_BLOCK_HEADER = re.compile(r"[|>][+-]?[1-9]?[+-]?")
# YAML's one-character escapes in double quotes, and what each stands for.
_DOUBLE_ESCAPES = dict(
    zip('0abt\tnvfre "/\\N_LP', '\0\a\b\t\t\n\v\f\r\x1b "/\\\x85\xa0\u2028\u2029', strict=True)
)
_DOUBLE_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.S)


def _unescape_double(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if len(code) > 1:
            value = int(code[1:], 16)
            return chr(value) if value <= 0x10FFFF else match.group(0)
        return _DOUBLE_ESCAPES.get(code, match.group(0))

    return _DOUBLE_ESCAPE.sub(one, text)


def _yaml_title(value: str, following: list[str]) -> str:
    """The text of a front-matter `title:` value, read as YAML reads a scalar: quoted
    (with its escapes), block (`>-`, `|`) or plain, over its continuation lines."""
    continued = []
    for line in following:
        if line.strip() and not line[:1].isspace():
            break
        continued.append(line.strip())
    if _BLOCK_HEADER.fullmatch(value.split(" #")[0].strip()):
        return " ".join(line for line in continued if line)
    text = " ".join([value, *continued]).strip()
    if text[:1] == '"':
        end = re.match(r'"((?:[^"\\]|\\.)*)"', text, re.S)
        return _unescape_double(end.group(1)) if end else text
    if text[:1] == "'":
        end = re.match(r"'((?:[^']|'')*)'", text)
        return end.group(1).replace("''", "'") if end else text
    text = re.split(r"[ \t]#", text, maxsplit=1)[0].strip()
    return "" if text in ("~", "null", "Null", "NULL") else text  # YAML's null: no title


def markdown_title(text: str) -> str:
    """The title a reader would give a Markdown document ("" if it has none).

    Front matter `title:` wins (static-site generators use it), then the first level-1
    heading, then the first heading of any level.
    """
    front = front_matter_end(text)
    if front:
        match = _FRONT_MATTER_TITLE.search(text, 0, front)
        if match:
            following = text[match.end() : front].split("\n")[1:]
            title = _yaml_title(match.group(1) or "", following).strip()
            if title:
                return title
    headings = [heading for heading in find_headings(text) if heading.text]
    for heading in headings:
        if heading.level == 1:
            return heading.text
    return headings[0].text if headings else ""


def load_markdown(path: Path) -> LoadedDocument:
    """A Markdown file: the body is the source, so headings keep guiding the chunker."""
    body = _decode(path.read_bytes(), path.name)
    return LoadedDocument(
        title=markdown_title(normalize_text(body)),
        body=body,
        metadata={"content_type": "text/markdown"},
    )


# --- HTML -----------------------------------------------------------------------------------

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
# The WHATWG encoding standard decodes these labels as windows-1252.
_HTML_CHARSET_ALIASES = {"iso8859-1": "cp1252", "ascii": "cp1252"}  # codecs names


def _html_encoding(data: bytes) -> str:
    """The charset a `<meta>` in the first 2 KB declares, else UTF-8."""
    match = _META_CHARSET.search(data[:2048])
    if not match:
        return "utf-8"
    try:
        name = codecs.lookup(match.group(1).decode("ascii")).name
    except LookupError:
        return "utf-8"
    if name.startswith("utf-16") or name.startswith("utf-32"):
        return "utf-8"  # a meta tag cannot declare UTF-16 (it would not be ASCII-readable)
    return _HTML_CHARSET_ALIASES.get(name, name)


class _HTMLText(HTMLParser):
    """Collects the visible text of an HTML page as paragraphs and lines."""

    SKIP = frozenset({"script", "style", "noscript", "template", "head", "svg", "iframe"})
    BLOCKS = frozenset(
        {
            "address", "article", "aside", "blockquote", "body", "caption", "center",
            "details", "dialog", "div", "dl", "fieldset", "figcaption", "figure", "footer",
            "form", "header", "hgroup", "hr", "html", "legend", "main", "menu", "nav", "ol",
            "p", "section", "summary", "table", "tbody", "tfoot", "thead", "ul",
        }
    )  # fmt: skip
    LINES = frozenset({"br", "dd", "dt", "li", "tr"})
    HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
    _ASCII_SPACE = re.compile(r"[ \t\n\r\f]+")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.breaks = 0  # newlines owed before the next line: 1 = new line, 2 = paragraph
        self.line: list[str] = []
        self.filled = False  # whether `line` holds visible text (or a cell separator)
        self.prefix = ""  # list marker or heading marks for the line being collected
        self.skip: list[str] = []
        self.title_parts: list[str] | None = None
        self.title = ""
        self.first_h1 = ""
        self.heading = 0  # level of the heading being collected
        self.pre = 0
        self.lists: list[int | None] = []  # per open list: next number, or None if bulleted

    # Output.
    def _flush(self) -> None:
        text = "".join(self.line)
        self.line = []
        self.filled = False
        # Preformatted text keeps its lines and indentation, fenced so that none of them
        # ("# a comment") reads as a heading; other text flows, and is escaped where it
        # would ("# 1 in sales").
        text = text.strip("\n").rstrip() if self.pre else self._ASCII_SPACE.sub(" ", text).strip()
        if not text or text.isspace():
            return
        if self.out:
            self.out.append("\n" * max(self.breaks, 1))
        if self.pre:
            # A list marker cannot share the fence's line: it would no longer be a fence.
            marker = self.prefix.rstrip()
            self.out.append(f"{marker}\n{code_block(text)}" if marker else code_block(text))
        else:
            self.out.append(self.prefix + (text if self.prefix else escape_line_start(text)))
        self.prefix = ""
        self.breaks = 0

    def _break(self, newlines: int) -> None:
        self._flush()
        self.breaks = max(self.breaks, newlines)

    def text(self) -> str:
        self._flush()
        return "".join(self.out)

    # Parser callbacks.
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body" and "head" in self.skip:
            del self.skip[self.skip.index("head") :]  # <body> closes an unclosed <head>
        if tag == "title" and not self.title and set(self.skip) <= {"head"}:
            self.title_parts = []
            return
        if tag in self.SKIP:
            self.skip.append(tag)
            return
        if self.skip:
            return
        if self.heading:
            if tag == "br":
                self.line.append(" ")
            return  # a heading stays one line, whatever is nested in it
        if tag in self.HEADINGS:
            self._break(2)
            self.heading = self.HEADINGS[tag]
        elif tag == "pre":
            self._break(2)
            self.pre += 1
        elif tag == "br":
            if self.pre:
                self.line.append("\n")
            else:
                self._break(1)
        elif tag in ("ul", "ol", "menu"):
            self._break(2 if not self.lists else 1)
            self.lists.append(1 if tag == "ol" else None)
        elif tag == "li":
            self._break(1)
            depth = max(len(self.lists), 1)
            number = self.lists[-1] if self.lists else None
            if number is None:
                marker = "- "
            else:
                marker = f"{number}. "
                self.lists[-1] = number + 1
            self.prefix = "  " * (depth - 1) + marker
        elif tag in ("td", "th"):
            if self.filled:
                self.line.append(" | ")
        elif tag in self.LINES:
            self._break(1)
        elif tag in self.BLOCKS:
            self._break(2)

    def handle_endtag(self, tag: str) -> None:
        if self.title_parts is not None and tag == "title":
            self.title = " ".join("".join(self.title_parts).split())
            self.title_parts = None
            return
        if tag in self.skip:
            del self.skip[len(self.skip) - 1 - self.skip[::-1].index(tag) :]
            return
        if self.skip:
            return
        if tag in self.HEADINGS and self.heading:
            text = self._ASCII_SPACE.sub(" ", "".join(self.line)).strip()
            if text and self.heading == 1 and not self.first_h1:
                self.first_h1 = text
            self.prefix = "#" * self.heading + " " if text else ""
            self.heading = 0
            self._break(2)
        elif self.heading:
            return
        elif tag == "pre" and self.pre:
            self._break(2)
            self.pre -= 1
        elif tag in ("ul", "ol", "menu"):
            if self.lists:
                self.lists.pop()
            self._break(2 if not self.lists else 1)
        elif tag in ("li", "dd", "dt", "tr"):
            self._break(1)
            self.prefix = ""  # an empty item must not lend its marker to the next line
        elif tag in self.BLOCKS:
            self._break(2)

    def handle_data(self, data: str) -> None:
        if self.title_parts is not None:
            self.title_parts.append(data)
        elif not self.skip:
            self.line.append(data)
            self.filled = self.filled or bool(data.strip())


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document: the visible text, with Markdown-style headings."""
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    body = parser.text()
    return parser.title or parser.first_h1, body


def load_html(path: Path) -> LoadedDocument:
    """An HTML file: its visible text, structured as paragraphs, lines and headings."""
    data = path.read_bytes()
    html = _decode(data, path.name, fallback=_html_encoding(data))
    title, body = html_to_text(html)
    return LoadedDocument(title=title, body=body, metadata={"content_type": "text/html"})


# --- PDF ------------------------------------------------------------------------------------


def load_pdf(path: Path) -> LoadedDocument:
    """A PDF file: the text of each page, pages separated by a blank line.

    Needs the optional `pypdf` package. Encrypted files are read only when they open with
    an empty password (a common "no printing" protection); scanned pages without a text
    layer yield nothing, and a PDF with no text at all is reported as such.
    """
    try:
        import pypdf  # optional: imported on first use, so the app works without it
    except ImportError as exc:
        raise LoaderError(
            path.name, 'reading PDF files needs pypdf: pip install "bailing-knowledge[pdf]"'
        ) from exc
    data = path.read_bytes()
    with collected_records("pypdf") as records:
        try:
            reader = pypdf.PdfReader(io.BytesIO(data))
            if reader.is_encrypted and not reader.decrypt(""):
                raise LoaderError(path.name, "the PDF is encrypted")
            pages = [(page.extract_text() or "").strip() for page in reader.pages]
            info = reader.metadata
            title = str(info.title or "") if info is not None else ""
        except LoaderError:
            raise
        except Exception as exc:
            # pypdf raises many kinds of errors on damaged or unusual files; none is fatal to
            # the other files of an ingest. What it logged on the way says more than the
            # error's own message ("EOF marker not found").
            said = "".join(f"; {message}" for message in distinct_messages(records))
            reason = f"not a readable PDF ({type(exc).__name__}{said})"
            raise LoaderError(path.name, reason) from exc
    body = "\n\n".join(page for page in pages if page)
    return LoadedDocument(
        title=title,
        body=body,
        metadata={"content_type": "application/pdf", "pages": len(pages)},
    )


register_loader(".txt", load_text)
register_loader(".md", load_markdown)
register_loader(".markdown", load_markdown)
register_loader(".html", load_html)
register_loader(".htm", load_html)
register_loader(".pdf", load_pdf)

SUPPORTED_SUFFIXES: frozenset[str] = supported_suffixes()
"""The suffixes supported out of the box (see `supported_suffixes()` for the live set)."""


# --- Finding files --------------------------------------------------------------------------


@dataclass(frozen=True)
class Discovered:
    """A file found under the paths given to `discover`.

    `source_key` is its idempotency key in a knowledge base: the POSIX path relative to the
    directory it was found under, or its name when the file was named directly. Unsupported
    files are listed too (`supported=False`) so that a command can say what it skipped.
    `root` is the directory it was found under (None for a file named directly), for
    `load_file` to keep links from reaching outside it.
    """

    path: Path
    source_key: str
    supported: bool
    root: Path | None = None


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _raise(error: OSError) -> None:
    raise error


def iter_files(root: Path) -> Iterator[tuple[Path, str]]:
    """Yield (path, source_key) for every file under `root`, in a deterministic order.

    Hidden files and directories (name starting with ".") are skipped. Symbolic links to
    files are yielded (`load_file(..., root=root)` refuses one that leads outside `root`);
    links to directories are not walked (no cycles, no escaping the tree) but yielded
    themselves, as is whatever else is not a directory, a dangling link or a named pipe among
    them: loading it fails (`load_file` never opens such a file), so it is reported, not
    silently left out.
    Files are sorted by their relative path, compared component by component. A file given
    as `root` yields itself, keyed by its name. Raises FileNotFoundError for a missing root,
    and the OSError of a directory that cannot be listed (no permission, say): skipping it
    would leave its files out without a word.
    """
    root = Path(root)
    if root.is_file():
        yield root, root.name
        return
    if not root.is_dir():
        raise FileNotFoundError(f"no such file or directory: {str(root)!r}")
    found: list[tuple[tuple[str, ...], Path]] = []
    for directory, dirnames, filenames in os.walk(root, onerror=_raise):
        base = Path(directory)
        linked = [name for name in dirnames if (base / name).is_symlink()]
        dirnames[:] = [name for name in dirnames if not _hidden(name) and name not in linked]
        for filename in [*filenames, *linked]:
            if _hidden(filename):
                continue
            path = base / filename
            found.append((path.relative_to(root).parts, path))
    found.sort(key=lambda item: item[0])
    for parts, path in found:
        yield path, "/".join(parts)


def discover(paths: Iterable[Path]) -> list[Discovered]:
    """Every file under `paths` (files or directories), marked supported or not.

    Paths are walked in the order given, each one's files sorted as in `iter_files`. Finding
    an unsupported file is not an error; a path that does not exist is (FileNotFoundError),
    because it is almost always a typo that would otherwise ingest nothing, and so is a
    directory that cannot be listed (its OSError).
    """
    found = []
    for named in map(Path, paths):
        root = None if named.is_file() else named
        found.extend(
            Discovered(path, key, get_loader(path) is not None, root)
            for path, key in iter_files(named)
        )
    return found
