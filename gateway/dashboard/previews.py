"""Previews of files inside a page: CSV and Excel as tables, text as text, each cut to a size a page can hold.

The page escapes every cell (files here are model output); a file that cannot be read gets a preview that says
why, and its download link stays.
"""

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from gateway.dashboard.files import kind
from gateway.dashboard.xlsx import WorkbookError, read_first_sheet

DEFAULT_MAX_ROWS = 50
"""Rows of a table shown in a page (the header included)."""

DEFAULT_MAX_COLUMNS = 30
"""Columns of a table shown in a page."""

DEFAULT_MAX_TEXT_BYTES = 64 * 1024
"""Bytes of a text or CSV file read for its preview."""

DEFAULT_MAX_WORKBOOK_BYTES = 10 * 1024 * 1024
"""Workbooks larger than this are not previewed (download them)."""


@dataclass
class Preview:
    """What a page shows of a file: ``rows`` (a table), ``text``, or ``problem`` (why nothing is shown)."""

    kind: str
    rows: list[list[str]] = field(default_factory=list)
    text: str = ""
    cut: bool = False
    """Rows, columns or text were left out."""
    problem: str = ""


def _head(path: Path, limit: int) -> tuple[bytes, bool]:
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit], len(data) > limit


def _csv_rows(path: Path, delimiter: str, max_rows: int, max_columns: int) -> Preview:
    data, cut = _head(path, DEFAULT_MAX_TEXT_BYTES)
    text = data.decode("utf-8-sig", errors="replace")
    rows: list[list[str]] = []
    try:
        for row in csv.reader(io.StringIO(text), delimiter=delimiter):
            if len(rows) == max_rows:
                cut = True
                break
            if len(row) > max_columns:
                cut = True
            rows.append([cell[:200] for cell in row[:max_columns]])
    except csv.Error as exc:
        return Preview("table", problem=f"not a readable CSV file ({exc})")
    if cut and rows and len(rows) < max_rows:
        rows.pop()  # the last row read may be cut mid-way
    return Preview("table", rows=rows, cut=cut)


def preview(path: Path, *, max_rows: int = DEFAULT_MAX_ROWS, max_columns: int = DEFAULT_MAX_COLUMNS) -> Preview:
    """A preview of the file at ``path`` by its kind (``files.kind``); images, audio and other kinds get an empty
    preview (the page embeds or links them). Raises nothing: a file that cannot be read has a ``problem``."""
    shown = kind(path.name)
    try:
        suffix = path.suffix.lower()
        if suffix in (".csv", ".tsv"):
            return _csv_rows(path, "\t" if suffix == ".tsv" else ",", max_rows, max_columns)
        if suffix == ".xlsx":
            if path.stat().st_size > DEFAULT_MAX_WORKBOOK_BYTES:
                return Preview("table", problem="the workbook is too large to preview; download it")
            rows, cut = read_first_sheet(path.read_bytes(), max_rows=max_rows, max_columns=max_columns)
            return Preview("table", rows=rows, cut=cut)
        if shown == "text":
            data, cut = _head(path, DEFAULT_MAX_TEXT_BYTES)
            return Preview("text", text=data.decode("utf-8", errors="replace"), cut=cut)
    except WorkbookError as exc:
        return Preview("table", problem=f"not a readable .xlsx workbook ({exc})")
    except OSError as exc:
        return Preview(shown, problem=f"cannot read the file ({exc.strerror or exc})")
    return Preview(shown)
