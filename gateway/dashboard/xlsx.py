"""The first sheet of an Excel ``.xlsx`` workbook as rows of text, read with the standard library only.

Workbooks here are model output: the reader is bounded (members read up to ``MAX_MEMBER_BYTES`` uncompressed,
rows and columns cut at the caller's limits), reads only the shared strings and the first worksheet, and never
evaluates formulas (a formula cell shows its cached value). A number whose cell style is a date or time format is
shown as an ISO date (and time). Legacy ``.xls`` files are not read (download them).
"""

import re
import zipfile
from datetime import datetime, timedelta
from io import BytesIO
from pathlib import PurePosixPath
from xml.etree import ElementTree

MAX_MEMBER_BYTES = 20 * 1024 * 1024
"""A workbook member larger than this once inflated is not read (a zip bomb is refused, not expanded)."""

_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_CELL_REF = re.compile(r"^([A-Z]{1,3})([0-9]+)$")

_DATE_FORMAT_IDS = frozenset((*range(14, 23), 45, 46, 47))
"""Excel's built-in number formats that show a date or a time."""

_FORMAT_NOISE = re.compile(r'"[^"]*"|\\.|\[[^\]]*\]|_.|\*.')
"""Quoted text, escaped characters, bracketed colours and conditions, padding: parts of a format that never make it a
date format."""

_EPOCH_1900, _EPOCH_1900_EARLY, _EPOCH_1904 = datetime(1899, 12, 30), datetime(1899, 12, 31), datetime(1904, 1, 1)
"""Day 0 of Excel's two date systems (the 1900 one before and after its phantom 29 February)."""

_MAX_SERIAL = 2_958_465
"""The serial number of 9999-12-31, Excel's last date."""


class WorkbookError(ValueError):
    """The file is not a workbook this reader can read (not a zip, no sheet, too large, malformed XML)."""


def _member(archive: zipfile.ZipFile, name: str) -> bytes | None:
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    if info.file_size > MAX_MEMBER_BYTES:
        raise WorkbookError(f"{name} inflates to {info.file_size} bytes; too large to preview")
    with archive.open(info) as handle:
        data = handle.read(MAX_MEMBER_BYTES + 1)
    if len(data) > MAX_MEMBER_BYTES:
        raise WorkbookError(f"{name} is too large to preview")
    return data


def _parse(data: bytes) -> ElementTree.Element:
    if b"<!DOCTYPE" in data[:4096] or b"<!ENTITY" in data:
        raise WorkbookError("the workbook declares XML entities; not read")
    try:
        return ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise WorkbookError(f"malformed workbook XML: {exc}") from exc


def _first_sheet(archive: zipfile.ZipFile) -> str:
    workbook = _member(archive, "xl/workbook.xml")
    rels = _member(archive, "xl/_rels/workbook.xml.rels")
    if workbook is not None and rels is not None:
        sheet = _parse(workbook).find(f"{_NS}sheets/{_NS}sheet")
        rel_id = sheet.get(f"{_REL_NS}id") if sheet is not None else None
        for rel in _parse(rels):
            if rel.get("Id") == rel_id and rel.get("Target"):
                target = rel.get("Target", "").lstrip("/")
                return target if target.startswith("xl/") else str(PurePosixPath("xl") / target)
    return "xl/worksheets/sheet1.xml"


def _is_date_format(code: str) -> bool:
    return any(letter in "dmyhs" for letter in _FORMAT_NOISE.sub("", code).lower())


def _date_styles(archive: zipfile.ZipFile) -> frozenset[int]:
    """The cell style indices (a cell's ``s``) whose number format shows a date or a time."""
    data = _member(archive, "xl/styles.xml")
    if data is None:
        return frozenset()
    styles = _parse(data)
    custom = {
        fmt.get("numFmtId", ""): _is_date_format(fmt.get("formatCode", "")) for fmt in styles.iter(f"{_NS}numFmt")
    }
    cell_formats = styles.find(f"{_NS}cellXfs")
    found = set()
    for index, xf in enumerate(cell_formats if cell_formats is not None else []):
        number_format = xf.get("numFmtId", "0")
        built_in = number_format.isdigit() and int(number_format) in _DATE_FORMAT_IDS
        if built_in or custom.get(number_format, False):
            found.add(index)
    return frozenset(found)


def _uses_1904(archive: zipfile.ZipFile) -> bool:
    data = _member(archive, "xl/workbook.xml")
    properties = _parse(data).find(f"{_NS}workbookPr") if data is not None else None
    return properties is not None and properties.get("date1904", "").lower() in ("1", "true")


def _date_text(raw: str, date1904: bool) -> str:
    """A serial date number as ISO text (a date, a date and time, or a time below one day); ``raw`` unchanged when
    it is not a number Excel could show as a date."""
    try:
        serial = float(raw)
    except ValueError:
        return raw
    if not 0 <= serial <= _MAX_SERIAL:
        return raw
    # Excel's 1900 system counts a 29 February 1900 that never was: serials below 61 start a day later.
    epoch = _EPOCH_1904 if date1904 else (_EPOCH_1900_EARLY if serial < 61 else _EPOCH_1900)
    moment = epoch + timedelta(seconds=round(serial * 86400))
    if serial < 1:
        return moment.strftime("%H:%M:%S")
    if moment.hour == moment.minute == moment.second == 0:
        return moment.date().isoformat()
    return moment.isoformat(sep=" ")


def _column(letters: str) -> int:
    number = 0
    for letter in letters:
        number = number * 26 + ord(letter) - ord("A") + 1
    return number - 1


def _shared_strings(archive: zipfile.ZipFile) -> list[str]:
    data = _member(archive, "xl/sharedStrings.xml")
    if data is None:
        return []
    return ["".join(t.text or "" for t in item.iter(f"{_NS}t")) for item in _parse(data).iter(f"{_NS}si")]


def _value(cell: ElementTree.Element, strings: list[str], dates: frozenset[int], date1904: bool) -> str:
    kind = cell.get("t", "n")
    if kind == "inlineStr":
        return "".join(t.text or "" for t in cell.iter(f"{_NS}t"))
    raw = cell.findtext(f"{_NS}v") or ""
    if kind == "s":
        try:
            return strings[int(raw)]
        except (ValueError, IndexError):
            return raw
    if kind == "b":
        return "TRUE" if raw == "1" else "FALSE"
    style = cell.get("s", "0")
    if kind == "n" and raw and style.isdigit() and int(style) in dates:
        return _date_text(raw, date1904)
    return raw


def read_first_sheet(data: bytes, *, max_rows: int, max_columns: int) -> tuple[list[list[str]], bool]:
    """The first sheet's cells as text, row by row (gaps filled with empty strings), and whether rows or columns
    were cut at ``max_rows`` / ``max_columns``.

    Raises:
        WorkbookError: not a readable ``.xlsx`` workbook.
    """
    try:
        archive = zipfile.ZipFile(BytesIO(data))
    except (zipfile.BadZipFile, OSError) as exc:
        raise WorkbookError(f"not an .xlsx workbook: {exc}") from exc
    with archive:
        strings = _shared_strings(archive)
        dates, date1904 = _date_styles(archive), _uses_1904(archive)
        sheet = _member(archive, _first_sheet(archive))
        if sheet is None:
            raise WorkbookError("the workbook has no worksheet")
        rows: list[list[str]] = []
        cut = False
        for row in _parse(sheet).iter(f"{_NS}row"):
            if len(rows) == max_rows:
                cut = True
                break
            values: list[str] = []
            for position, cell in enumerate(row.iter(f"{_NS}c")):
                match = _CELL_REF.match(cell.get("r", ""))
                column = _column(match.group(1)) if match else position
                if column >= max_columns:
                    cut = True
                    continue
                values.extend([""] * (column - len(values)))
                values.append(_value(cell, strings, dates, date1904))
            rows.append(values)
    return rows, cut
