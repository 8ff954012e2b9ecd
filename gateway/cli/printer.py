"""Where the CLI's output goes: plain aligned text (pipes, files, tests), or rich tables on a terminal."""

import importlib.util
from typing import Any, TextIO


def rich_available() -> bool:
    """Whether the optional ``rich`` package (``pip install 'pybench-eval[cli]'``) is installed."""
    return importlib.util.find_spec("rich") is not None


def ratio(passed: int, of: int) -> str:
    """``3/5 60.0%``; ``-`` when there is nothing to divide by."""
    return f"{passed}/{of} {passed / of:.1%}" if of else "-"


def shorten(text: str, width: int) -> str:
    """The text on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class Printer:
    """Writes lines and tables to ``out``; ``styled`` (default: ``out`` is a terminal and rich is installed)
    draws tables, progress bars and colours with rich."""

    def __init__(self, out: TextIO, *, styled: bool | None = None) -> None:
        self.out = out
        isatty = getattr(out, "isatty", None)
        terminal = bool(isatty()) if callable(isatty) else False
        self.styled = (terminal and rich_available()) if styled is None else styled
        self._console: Any = None

    @property
    def console(self) -> Any:
        """A rich ``Console`` on ``out`` (only when ``styled``)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.out, force_terminal=True, highlight=False)
        return self._console

    def line(self, text: str = "") -> None:
        if self.styled:
            self.console.print(text, markup=False)
        else:
            print(text, file=self.out, flush=True)

    def table(self, headers: list[str], rows: list[list[str]], *, title: str | None = None) -> None:
        """A table: columns aligned to their widest cell, numbers and rates on the right."""
        numeric = [all(_numeric(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]
        if self.styled:
            from rich.table import Table

            table = Table(title=title, title_justify="left")
            for header, right in zip(headers, numeric, strict=True):
                table.add_column(header, justify="right" if right else "left", overflow="fold")
            for row in rows:
                table.add_row(*row)
            self.console.print(table)
            return
        if title:
            print(title, file=self.out)
        widths = [max(len(str(c)) for c in [header, *(row[i] for row in rows)]) for i, header in enumerate(headers)]

        def render(cells: list[str]) -> str:
            parts = [c.rjust(w) if right else c.ljust(w) for c, w, right in zip(cells, widths, numeric, strict=True)]
            return "  ".join(parts).rstrip()

        print(render(headers), file=self.out)
        for row in rows:
            print(render(row), file=self.out)
        print(file=self.out, flush=True)


def _numeric(cell: str) -> bool:
    head = cell.split(" ", 1)[0].replace("/", "").replace(".", "").replace("%", "")
    return cell == "-" or head.isdigit()
