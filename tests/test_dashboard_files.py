"""The dashboard's file previews without a server: the bounded .xlsx reader against the suite's real workbooks (each
checked against its CSV twin where the suite has one) and against hostile workbooks, and CSV previews cut to a
page's size."""

import csv
import io
import math
import zipfile
from pathlib import Path

import pytest

from gateway.dashboard.files import kind
from gateway.dashboard.previews import DEFAULT_MAX_ROWS, preview
from gateway.dashboard.xlsx import MAX_MEMBER_BYTES, WorkbookError, read_first_sheet

TWINS = ("tv", "tv_cleaned", "wta_matches_qual_itf_1975", "Turkey_Syria_Earthquake")
"""Suite data sets stored both as .xlsx and as .csv (the same table)."""


def _same_cell(got: str, want: str) -> bool:
    """Numbers compare as numbers: the CSV says 172000000.0 where the workbook stores 172000000, and a long id the
    CSV writes whole is stored as a float in the workbook; other text compares exactly."""
    try:
        return math.isclose(float(got), float(want), rel_tol=1e-12)
    except ValueError:
        return got == want


@pytest.mark.parametrize("name", TWINS)
def test_a_suite_workbook_reads_as_its_csv_twin(suite_path: Path, name: str) -> None:
    data = suite_path / "data"
    rows, cut = read_first_sheet((data / f"{name}.xlsx").read_bytes(), max_rows=20, max_columns=60)
    with (data / f"{name}.csv").open(encoding="utf-8-sig", newline="") as handle:
        expected = [row for _, row in zip(range(20), csv.reader(handle), strict=False)]
    assert cut  # every twin has more than 20 rows
    assert rows[0] == expected[0]
    for got, want in zip(rows[1:], expected[1:], strict=True):
        got += [""] * (len(want) - len(got))  # a row's trailing empty cells are not stored in the sheet
        assert len(got) == len(want) and all(_same_cell(g, w) for g, w in zip(got, want, strict=True)), (got, want)


def test_every_suite_workbook_previews_as_a_table_within_its_limits(suite_path: Path) -> None:
    workbooks = sorted((suite_path / "data").glob("*.xlsx"))
    assert len(workbooks) >= 10
    for path in workbooks:
        shown = preview(path, max_rows=5, max_columns=4)
        assert kind(path.name) == "table" and shown.problem == "", path.name
        assert 1 <= len(shown.rows) <= 5 and all(len(row) <= 4 for row in shown.rows), path.name
        assert any(cell.strip() for cell in shown.rows[0]), path.name  # a header row with text


def _workbook(sheet: bytes, **members: bytes) -> bytes:
    """A minimal .xlsx: a worksheet at the default place, and ``members`` (``strings``: xl/sharedStrings.xml,
    ``styles``: xl/styles.xml, ``workbook``: xl/workbook.xml without relations, so the default sheet is read)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("xl/worksheets/sheet1.xml", sheet)
        for name, content in members.items():
            archive.writestr({"strings": "xl/sharedStrings.xml"}.get(name, f"xl/{name}.xml"), content)
    return buffer.getvalue()


NS = b'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'


def test_cells_by_reference_shared_strings_booleans_and_column_cuts() -> None:
    sheet = (
        b"<worksheet " + NS + b"><sheetData>"
        b'<row r="1"><c r="A1" t="s"><v>0</v></c><c r="C1" t="inlineStr"><is><t>&lt;b&gt;</t></is></c></row>'
        b'<row r="2"><c r="A2" t="b"><v>1</v></c><c r="B2"><v>2.5</v></c><c r="E2"><v>9</v></c></row>'
        b"</sheetData></worksheet>"
    )
    strings = b"<sst " + NS + b"><si><t>month</t></si></sst>"
    rows, cut = read_first_sheet(_workbook(sheet, strings=strings), max_rows=10, max_columns=4)
    assert rows == [["month", "", "<b>"], ["TRUE", "2.5"]]  # E2 is past 4 columns
    assert cut


def test_dates_show_as_dates_in_the_suites_workbooks(suite_path: Path) -> None:
    data = suite_path / "data"
    adidas, _ = read_first_sheet((data / "AdidasSalesdata.xlsx").read_bytes(), max_rows=2, max_columns=4)
    assert adidas[0][2] == "Invoice Date" and adidas[1][2] == "2021-10-26"  # stored as 44495.0, "dddd, mmmm d, yyyy"
    assert adidas[1][1] == "1185732.0"  # a plain number stays a number
    weather, _ = read_first_sheet((data / "Farm_Weather_Data.xlsx").read_bytes(), max_rows=2, max_columns=2)
    assert weather[0][0] == "Date" and weather[1][0] == "2006-01-08"


def test_date_times_times_and_the_1904_date_system() -> None:
    styles = (
        b"<styleSheet " + NS + b'><numFmts count="1"><numFmt numFmtId="164" formatCode="yyyy-mm-dd hh:mm"/>'
        b'</numFmts><cellXfs count="4"><xf numFmtId="0"/><xf numFmtId="164"/><xf numFmtId="21"/>'
        b'<xf numFmtId="165"/></cellXfs></styleSheet>'
    )
    sheet = (
        b"<worksheet " + NS + b'><sheetData><row r="1">'
        b'<c r="A1" s="1"><v>44495.75</v></c><c r="B1" s="2"><v>0.5</v></c><c r="C1" s="0"><v>44495</v></c>'
        b'<c r="D1" s="1"><v>-3</v></c><c r="E1" s="1" t="s"><v>0</v></c><c r="F1" s="1"><v>1</v></c>'
        b'<c r="G1" s="1"><v>60</v></c><c r="H1" s="1"><v>61</v></c>'
        b"</row></sheetData></worksheet>"
    )
    strings = b"<sst " + NS + b"><si><t>text</t></si></sst>"
    rows, _ = read_first_sheet(_workbook(sheet, styles=styles, strings=strings), max_rows=5, max_columns=9)
    # Serial 1 is 1 January 1900 and 61 is 1 March; 60, Excel's 29 February 1900 that never was, shows as 1 March.
    dates = ["1900-01-01", "1900-03-01", "1900-03-01"]
    assert rows == [["2021-10-26 18:00:00", "12:00:00", "44495", "-3", "text", *dates]]
    in_1904 = b"<workbook " + NS + b'><workbookPr date1904="1"/></workbook>'
    rows, _ = read_first_sheet(
        _workbook(sheet, styles=styles, strings=strings, workbook=in_1904), max_rows=5, max_columns=1
    )
    assert rows == [["2025-10-27 18:00:00"]]  # the same serial from 1904-01-01: 1462 days later


def test_hostile_workbooks_are_refused_not_expanded() -> None:
    with pytest.raises(WorkbookError, match="not an .xlsx"):
        read_first_sheet(b"<script>alert(1)</script>", max_rows=5, max_columns=5)
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        b"<worksheet " + NS + b'><sheetData><row><c t="inlineStr"><is><t>&lol2;</t></is></c></row>'
        b"</sheetData></worksheet>"
    )
    with pytest.raises(WorkbookError, match="entities"):
        read_first_sheet(_workbook(laughs), max_rows=5, max_columns=5)
    bomb = _workbook(b" " * (MAX_MEMBER_BYTES + 1))  # compresses to a few kilobytes
    assert len(bomb) < 100_000
    with pytest.raises(WorkbookError, match="too large"):
        read_first_sheet(bomb, max_rows=5, max_columns=5)
    with pytest.raises(WorkbookError, match="no worksheet"):
        read_first_sheet(_workbook_without_sheet(), max_rows=5, max_columns=5)


def _workbook_without_sheet() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("docProps/app.xml", b"<Properties/>")
    return buffer.getvalue()


def test_a_broken_workbook_previews_with_its_problem(tmp_path: Path) -> None:
    path = tmp_path / "broken.xlsx"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    shown = preview(path)
    assert shown.rows == [] and "not a readable .xlsx workbook" in shown.problem


def test_a_long_csv_is_cut_to_a_pages_rows(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("n,square\n" + "".join(f"{n},{n * n}\n" for n in range(1000)))
    shown = preview(path)
    assert shown.cut and len(shown.rows) == DEFAULT_MAX_ROWS
    assert shown.rows[0] == ["n", "square"] and shown.rows[-1] == [
        str(DEFAULT_MAX_ROWS - 2),
        str((DEFAULT_MAX_ROWS - 2) ** 2),
    ]
