"""The checks that open produced files, one small function per kind. They run inside a grading sandbox.

Loading an agent's pickle runs the agent's code, and parsing its files is the grader's largest attack
surface, so these checks never run in the grader's process: ``services.sandbox.grading`` copies this file into a
fresh grading sandbox of the sandbox image (which has the scientific stack the tasks used; a container or a pod)
and runs it as ``python file_checks.py request.json``. Only the standard library is imported at module level; each kind
imports what it needs (pandas, PIL, numpy, cv2, mutagen, pydub) when it runs.

A check is data: ``{"kind": "csv_no_nulls", "path": "./output/4.csv"}``. Paths are relative to the root the
request names (``./output/...`` for what the session produced, ``./data/...`` for the task's inputs); an
absolute path or one that climbs out with ``..`` is refused, and the check fails. The kinds reproduce what
PyBench's own unit tests compute, quirks included where they decide outcomes (see each docstring); where a
test's arithmetic is accidental, the docstring says which reading was taken.

``run`` never raises: a check that crashes (a corrupt file, a missing column) is a failed check whose detail
says ``check crashed: <ExcType>: <message>``; an unknown kind is undecided (``passed`` None).
"""

import contextlib
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

MAX_DETAIL_CHARS = 1000
"""Details longer than this are cut: a result line stays small whatever a file holds."""

EXCEL_SUFFIXES = (".xls", ".xlsx", ".xlsm")
"""Tables with these suffixes are read with ``pandas.read_excel``, every other one with ``read_csv``."""

Outcome = tuple[bool, str]


class CheckFailed(Exception):
    """The check failed for a reason to report as it is: a file not produced, a refused path."""


class MalformedCheck(Exception):
    """The check's parameters are not what its kind needs."""


# -- parameters and paths ----------------------------------------------------------------------------------


def _param(check: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = check.get(name)
    if not isinstance(value, kind):
        raise MalformedCheck(f"{check.get('kind')} needs '{name}', got {value!r}")
    return value


def _number(check: dict[str, Any], name: str) -> float:
    value = check.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedCheck(f"{check.get('kind')} needs '{name}': a number, got {value!r}")
    return float(value)


def _choice(check: dict[str, Any], name: str, choices: dict[str, Any]) -> Any:
    value = check.get(name)
    if not isinstance(value, str) or value not in choices:
        raise MalformedCheck(f"{check.get('kind')} needs '{name}' among {sorted(choices)}, got {value!r}")
    return choices[value]


def resolve(root: Path, value: object, name: str = "path") -> Path:
    """The path ``value`` (``./output/x.csv``) names under ``root``.

    Raises:
        MalformedCheck: ``value`` is not a non-empty string.
        CheckFailed: ``value`` is absolute, climbs out with ``..``, or leads out of ``root`` through a link.
    """
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise MalformedCheck(f"'{name}' must be a non-empty path, got {value!r}")
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or ".." in parts:
        raise CheckFailed(f"refused path {value!r}: checks only read inside the workspace")
    path = root.joinpath(*[part for part in parts if part != "."])
    if not path.resolve().is_relative_to(root.resolve()):
        raise CheckFailed(f"refused path {value!r}: it leads out of the workspace")
    return path


def _existing(root: Path, value: object, name: str) -> Path:
    """The file ``value`` names; one that is not there fails the check (as the session's or the input's fault)."""
    path = resolve(root, value, name)
    if path.is_file():
        return path
    if path.exists():
        raise CheckFailed(f"{value} is not a file")
    raise CheckFailed(f"the reference {value} is missing" if name == "ref" else f"the session did not produce {value}")


def _file(check: dict[str, Any], root: Path, name: str = "path") -> Path:
    """The existing file that parameter ``name`` names."""
    return _existing(root, check.get(name), name)


def _files(check: dict[str, Any], root: Path, name: str = "paths") -> list[Path]:
    """The existing files that parameter ``name`` (a non-empty list) names."""
    values = _param(check, name, list)
    if not values:
        raise MalformedCheck(f"{check.get('kind')} needs '{name}': a non-empty list of paths")
    return [_existing(root, value, name) for value in values]


def _compare(left: float, op: str, right: float) -> bool:
    return {"lt": left < right, "le": left <= right, "gt": left > right, "ge": left >= right}[op]


# -- tables (pandas) ---------------------------------------------------------------------------------------


def _read_csv(path: Path) -> Any:
    import pandas as pd

    return pd.read_csv(path)


def _read_table(path: Path) -> Any:
    import pandas as pd

    return pd.read_excel(path) if path.suffix.lower() in EXCEL_SUFFIXES else pd.read_csv(path)


def csv_no_duplicates(check: dict[str, Any], root: Path) -> Outcome:
    """No row of the CSV at ``path`` repeats an earlier one (``DataFrame.duplicated``, all columns)."""
    count = int(_read_csv(_file(check, root)).duplicated().sum())
    return count == 0, "no duplicate rows" if count == 0 else f"{count} duplicate row(s)"


def csv_no_nulls(check: dict[str, Any], root: Path) -> Outcome:
    """No cell of the CSV at ``path`` is empty or NaN (``DataFrame.isnull``)."""
    nulls = _read_csv(_file(check, root)).isnull().sum()
    total = int(nulls.sum())
    where = {str(column): int(count) for column, count in nulls.items() if count}
    return total == 0, "no null cells" if total == 0 else f"{total} null cell(s): {where}"


def csv_no_iqr_outliers(check: dict[str, Any], root: Path) -> Outcome:
    """No value of a column of ``dtypes`` lies outside ``[Q1 - k*IQR, Q3 + k*IQR]``, quartiles recomputed on
    the saved file (so clipping to the bounds passes, while dropping rows once may leave new outliers)."""
    k = _number(check, "k")
    dtypes = _param(check, "dtypes", list)
    frame = _read_csv(_file(check, root))
    outliers: dict[str, int] = {}
    for column in frame.select_dtypes(include=dtypes).columns:
        values = frame[column]
        q1, q3 = values.quantile(0.25), values.quantile(0.75)
        count = int(((values < q1 - k * (q3 - q1)) | (values > q3 + k * (q3 - q1))).sum())
        if count:
            outliers[str(column)] = count
    return not outliers, "no outliers" if not outliers else f"outliers by column: {outliers}"


def _numeric_string_columns(frame: Any) -> list[str]:
    """PyBench's helper: object columns that ``to_numeric`` accepts once commas are removed (and cells that are
    exactly ``$`` are emptied: it calls ``Series.replace``, not ``str.replace``, for the dollar sign)."""
    import pandas as pd

    columns = []
    for column in frame.columns:
        if frame[column].dtype == "object":
            try:
                pd.to_numeric(frame[column].str.replace(",", "").replace("$", ""), errors="raise")
                columns.append(str(column))
            except ValueError:
                pass
    return columns


def table_no_numeric_strings(check: dict[str, Any], root: Path) -> Outcome:
    """No table of ``paths`` (Excel by suffix, else CSV) keeps a column of numbers stored as strings."""
    found = {}
    for path in _files(check, root):
        columns = _numeric_string_columns(_read_table(path))
        if columns:
            found[path.name] = columns
    return not found, "no numeric columns stored as strings" if not found else f"numbers stored as strings: {found}"


def csv_column_datetime(check: dict[str, Any], root: Path) -> Outcome:
    """Every value of ``column`` parses as a date (``pandas.to_datetime``); the format is not checked."""
    column = _param(check, "column", str)
    frame = _read_csv(_file(check, root))
    import pandas as pd

    if column not in frame.columns:
        return False, f"no column {column!r} in {check['path']} (columns: {[str(c) for c in frame.columns]})"
    parsed = pd.to_datetime(frame[column], errors="coerce")
    bad = int(parsed.isna().sum())
    return bad == 0, f"all {len(parsed)} values are dates" if bad == 0 else f"{bad} value(s) are not dates"


def excel_readable(check: dict[str, Any], root: Path) -> Outcome:
    """The first of ``paths`` that pandas reads as Excel passes; the others are tried in order.

    PyBench's test reads the first and then asserts on the DataFrame (``assert df``), which raises, so it
    always fails; that outcome belongs to the grading that keeps the benchmark's bugs, not to this kind.
    """
    reasons = []
    for value in _param(check, "paths", list):
        path = resolve(root, value, "paths")
        if not path.is_file():
            reasons.append(f"the session did not produce {value}")
            continue
        import pandas as pd

        try:
            frame = pd.read_excel(path)
        except Exception as exc:
            reasons.append(f"{value} unreadable ({type(exc).__name__}: {exc})")
            continue
        return True, f"{value} reads as Excel: {frame.shape[0]} rows x {frame.shape[1]} columns"
    return False, "; ".join(reasons) or "no paths given"


def csv_rows(check: dict[str, Any], root: Path) -> Outcome:
    """The CSV at ``path`` has exactly ``n`` data rows (``DataFrame.shape[0]``, header excluded)."""
    n = int(_number(check, "n"))
    rows = int(_read_csv(_file(check, root)).shape[0])
    return rows == n, f"{rows} rows, want {n}"


def csv_sorted_by(check: dict[str, Any], root: Path) -> Outcome:
    """The rows of the CSV at ``path`` are in the order of ``by`` with ``ascending`` (one flag per column).

    PyBench compares the file with ``df.sort_values(...)`` by ``DataFrame.equals``, index included, with the
    default (unstable) sort, so a sorted file with tied keys can fail depending on the sort's whims. Here the
    key columns are compared with a stable sort of them: ties may come in any order; NaN sorts last.
    """
    by = _param(check, "by", (list, str))
    ascending = _param(check, "ascending", (list, bool))
    by = [by] if isinstance(by, str) else by
    frame = _read_csv(_file(check, root))
    missing = [column for column in by if column not in frame.columns]
    if missing:
        return False, f"no column(s) {missing} in {check['path']}"
    keys = frame[by].reset_index(drop=True)
    ordered = frame.sort_values(by=by, ascending=ascending, kind="stable")[by].reset_index(drop=True)
    if keys.equals(ordered):
        return True, f"sorted by {by} (ascending={ascending})"
    differs = ~((keys == ordered) | (keys.isna() & ordered.isna())).all(axis=1)
    return False, f"not sorted by {by} (ascending={ascending}): first row out of place is row {int(differs.idxmax())}"


# -- pickles -------------------------------------------------------------------------------------------------

PREDICT_ROWS = 20
"""How many rows of the task's data ``model_predicts`` asks the model to predict."""

MODEL_LOADER = Path(__file__).with_name("model_loader.py")
"""The script that unpickles in a child interpreter (shipped beside this file into the grading sandbox)."""


@functools.cache
def checker_sources() -> dict[str, bytes]:
    """The checker a grading sandbox runs, by file name: this file and ``model_loader.py`` (read once: every
    grading sends them)."""
    return {path.name: path.read_bytes() for path in (Path(__file__), MODEL_LOADER)}


def _load_pickle(
    path: Path, root: Path, with_joblib: bool, data: Path | None = None, nonce: str = ""
) -> tuple[int, list[str]]:
    """Run ``model_loader.py`` on ``path`` in a child interpreter (given ``data``, with ``nonce`` on its stdin);
    return its exit code and its output's last lines. Whatever the child left running is then killed."""
    how = "joblib" if with_joblib else "pickle"
    table = [str(data), str(PREDICT_ROWS), "excel" if data.suffix.lower() in EXCEL_SUFFIXES else "csv"] if data else []
    with tempfile.TemporaryFile() as log:
        try:
            finished = subprocess.run(
                [sys.executable, "-I", "-B", "-u", str(MODEL_LOADER), str(path), how, *table],
                cwd=root,
                input=f"{nonce}\n".encode() if data else None,
                stdin=None if data else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        finally:
            _end_strays()
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return finished.returncode, lines


GRADING_SANDBOX_VARIABLE = "PBE_GRADING_SANDBOX"
"""Set to 1 in the checker's environment by the grading sandbox (``services.sandbox.grading``)."""

SANDBOX_UID = 1000
"""The sandbox user (``services.sandbox.contract.SANDBOX_UID``; the checker runs on the image's Python alone)."""


def _is_sleeper(cmdline: bytes) -> bool:
    """Whether ``cmdline`` (``/proc/<pid>/cmdline``) is a grading sandbox's process 1: ``sleep <seconds>``, which only
    keeps the sandbox up (``services.sandbox.contract.UNATTENDED_LIFETIME_S``)."""
    parts = cmdline.split(b"\0")
    return len(parts) == 3 and parts[0] == b"sleep" and parts[1].isdigit() and parts[2] == b""


def _in_grading_sandbox() -> bool:
    """Whether every other process this one may signal belongs to the grading sandbox: it is the sandbox's process
    1, or an ``exec`` in a grading sandbox (the variable set, running as the sandbox user, and process 1 of its
    namespace the sandbox's sleeper). Anywhere else (the checker run by hand, by a test, or by the local backend on
    the host) none of the three holds together. Raises nothing."""
    if os.getpid() == 1:
        return True
    if os.environ.get(GRADING_SANDBOX_VARIABLE) != "1" or os.getuid() != SANDBOX_UID:
        return False
    try:
        return _is_sleeper(Path("/proc/1/cmdline").read_bytes())
    except OSError:
        return False


def _end_strays() -> None:
    """Kill every other process, and reap them: what a pickle's code may have left running (``pickle_loads``
    runs it) must not outlive its check, to read a later loader's nonce or write into its output. Only in a grading
    sandbox (``_in_grading_sandbox``), whose processes are all the checker's (its process 1, the sleeper, takes no
    signal it does not handle); elsewhere it does nothing. Best effort: gives up after about a second."""
    if not _in_grading_sandbox():
        return
    spared = _ancestry()  # as an exec, what runs it (the exec's time limit) must live on
    for _ in range(100):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not _kill_all_but(spared):
            return
        time.sleep(0.01)


def _ancestry() -> set[int]:
    """This process and its ancestors up to process 1 (read from ``/proc``; as process 1, itself alone)."""
    chain, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            break
        pid = int(fields[1])
        chain.add(pid)
    return chain | {1}


def _kill_all_but(spared: set[int]) -> bool:
    """SIGKILL every process this one may signal but ``spared``; returns whether any was signalled."""
    if os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)  # every process this one may signal, bar itself
        except ProcessLookupError:
            return False
        return True
    signalled = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # already dead, waiting for process 1 to reap it
            os.kill(int(entry), signal.SIGKILL)
            signalled = True
    return signalled


def _joblib_param(check: dict[str, Any]) -> bool:
    return bool(_param(check, "joblib", bool)) if "joblib" in check else False


def _load_failed(code: int, lines: list[str], with_joblib: bool) -> str:
    how = "pickle.load and joblib.load" if with_joblib else "pickle.load"
    if code < 0:
        cause = " (out of memory?)" if code == -9 else ""
        return f"{how} failed: the loading process was killed by signal {-code}{cause}"
    return f"{how} failed: {lines[-1] if lines else f'exit code {code}'}"


def pickle_loads(check: dict[str, Any], root: Path) -> Outcome:
    """``pickle.load`` of the file at ``path`` succeeds (with the libraries of this image: a model of a library
    the image lacks, e.g. keras, fails). A ``joblib.dump`` with numpy arrays is not a plain pickle and fails,
    as it does in PyBench's test, unless ``joblib`` is true: then ``joblib.load`` is tried after ``pickle.load``.
    Whatever it loads passes (PyBench's test asks no more), even an ``int`` a pickle's code returned; the
    detail names the type.

    Loading runs the pickle's code, so it happens in a child interpreter of its own (isolated mode, no handle
    on this process's output): the code cannot rewrite the other checks' results. Its time counts against
    the sandbox's time limit.
    """
    path = _file(check, root)
    with_joblib = _joblib_param(check)
    code, lines = _load_pickle(path, root, with_joblib)
    if code == 0 and lines and lines[-1].startswith("loaded a "):
        return True, lines[-1]
    return False, _load_failed(code, lines, with_joblib)


def model_predicts(check: dict[str, Any], root: Path) -> Outcome:
    """The file at ``path`` loads as in ``pickle_loads`` into a fitted model: an object whose ``predict`` answers
    one prediction per row for up to ``PREDICT_ROWS`` rows of the table ``data`` (the task's input, CSV or Excel
    by suffix) without raising; the features are the columns the model says it was fitted on
    (``model_loader.features_of``). With ``joblib``, ``joblib.load`` is also tried when ``pickle.load`` gives no
    model. An unfitted estimator fails, as does anything without ``predict`` (the ``int`` a pickle's code
    returned); the detail names the loaded type and what was predicted on.

    Unlike ``pickle_loads``, it runs none of the pickle's code: the child interpreter unpickles with
    ``model_loader.RestrictedUnpickler``, and a pickle that names anything but a model library's class or
    reconstructor fails with ``refused: the pickle names posix.system, ...``. Only the child's lines that start
    with a fresh nonce (given on its stdin) count, so nothing else that writes to its output can pass the check.
    """
    path = _file(check, root)
    with_joblib = _joblib_param(check)
    data = resolve(root, check.get("data"), "data")
    if not data.is_file():
        raise CheckFailed(f"the task's input {check.get('data')} is missing from the grading sandbox")
    nonce = secrets.token_hex(16)
    code, lines = _load_pickle(path, root, with_joblib, data, nonce)
    said = [line.removeprefix(nonce).strip() for line in lines if line.startswith(f"{nonce} ")]
    lines = [line.removeprefix(nonce).strip() for line in lines]
    loaded = next((line for line in reversed(said) if line.startswith("loaded a ")), None)
    if loaded is None:
        refused = bool(said) and said[-1].startswith("refused: ")
        return False, said[-1] if refused else _load_failed(code, lines, with_joblib)
    if code == 0 and said[-1].startswith("predicted "):
        return True, f"{loaded}: {said[-1]}"
    if code < 0:
        return False, f"{loaded}: the predicting process was killed by signal {-code}"
    return False, f"{loaded}: {lines[-1] if lines[-1] != loaded else f'exit code {code}'}"


# -- images (PIL, numpy, cv2) --------------------------------------------------------------------------------


def _gray(image: Any) -> Any:
    import numpy as np

    return np.array(image.convert("L"))


def _mean_gray(image: Any) -> float:
    return float(_gray(image).mean())


def _std_gray(image: Any) -> float:
    return float(_gray(image).std())


def _mean_hsv_s(image: Any) -> float:
    import numpy as np

    return float(np.array(image.convert("HSV"))[:, :, 1].mean())


def _laplacian_var(image: Any) -> float:
    import cv2

    return float(cv2.Laplacian(_gray(image), cv2.CV_64F).var())


IMAGE_STATS: dict[str, Callable[[Any], float]] = {
    "mean_gray": _mean_gray,
    "std_gray": _std_gray,
    "mean_hsv_s": _mean_hsv_s,
    "laplacian_var": _laplacian_var,
}
"""Image statistics by name, as PyBench's tests compute them: brightness and contrast (mean and standard
deviation of PIL's grey ``L``), saturation (mean S of PIL's ``HSV``), sharpness (variance of OpenCV's
Laplacian of the grey image)."""

COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}
"""The comparisons ``op`` may name, with the sign details show."""


def _open_image(path: Path) -> Any:
    from PIL import Image

    return Image.open(path)


def image_stat_vs_input(check: dict[str, Any], root: Path) -> Outcome:
    """``stat`` of the image at ``path`` compares by ``op`` (lt, le, gt, ge) with the same of ``ref``."""
    stat = _choice(check, "stat", IMAGE_STATS)
    op = _choice(check, "op", {name: name for name in COMPARISONS})
    with _open_image(_file(check, root)) as output, _open_image(_file(check, root, "ref")) as reference:
        mine, theirs = stat(output), stat(reference)
    passed = _compare(mine, op, theirs)
    return passed, f"{check['stat']} {mine:.4g} (output) {COMPARISONS[op]} {theirs:.4g} (input): {passed}"


def image_size(check: dict[str, Any], root: Path) -> Outcome:
    """The image at ``path`` is ``width`` x ``height`` pixels."""
    width, height = int(_number(check, "width")), int(_number(check, "height"))
    with _open_image(_file(check, root)) as image:
        size = image.size
    return size == (width, height), f"{size[0]}x{size[1]}, want {width}x{height}"


def image_square(check: dict[str, Any], root: Path) -> Outcome:
    """The image at ``path`` is as wide as it is high."""
    with _open_image(_file(check, root)) as image:
        width, height = image.size
    return width == height, f"{width}x{height}"


def image_mode(check: dict[str, Any], root: Path) -> Outcome:
    """The image at ``path`` has PIL mode ``mode`` (``L``: a grey image saved with three channels fails)."""
    mode = _param(check, "mode", str)
    with _open_image(_file(check, root)) as image:
        actual = image.mode
    return actual == mode, f"mode {actual}, want {mode}"


def image_dark_fraction(check: dict[str, Any], root: Path) -> Outcome:
    """More than ``min_fraction_exclusive`` of the pixels of the image at ``path`` are dark: grey value (PIL's
    ``L``, alpha ignored) at most ``gray_max``. A transparent background is not dark unless its colour is."""
    gray_max, least = _number(check, "gray_max"), _number(check, "min_fraction_exclusive")
    with _open_image(_file(check, root)) as image:
        gray = _gray(image)
    fraction = float((gray <= gray_max).sum() / gray.size)
    return fraction > least, f"{fraction:.3f} of the pixels have grey <= {gray_max:g}, want > {least:g}"


INVERSES: dict[str, tuple[str, Any]] = {
    "rotate_ccw_90_expand": ("rotate", 90),
    "rotate_180_expand": ("rotate", 180),
    "rotate_ccw_270_expand": ("rotate", 270),
    "flip_left_right": ("transpose", "FLIP_LEFT_RIGHT"),
    "flip_top_bottom": ("transpose", "FLIP_TOP_BOTTOM"),
}
"""The transforms that undo the task's, by name: PIL's counter-clockwise ``rotate(angle, expand=True)`` or
``transpose``."""


def _invert(image: Any, how: tuple[str, Any]) -> Any:
    from PIL import Image

    method, argument = how
    if method == "rotate":
        return image.rotate(argument, expand=True)
    return image.transpose(getattr(Image.Transpose, argument))


def image_matches_input_after_inverse(check: dict[str, Any], root: Path) -> Outcome:
    """The image at ``path``, put back by ``inverse``, is close to ``ref``: at least ``min_similar_fraction``
    of its pixels have every channel within ``per_channel_tolerance`` x 255 of the reference's.

    As PyBench's helper does: the reference is resized to the output's size and converted to its mode, and
    the difference is ``abs(a - b)`` on the 8-bit arrays, so it wraps modulo 256: a pixel a little darker
    than the reference counts as far off. That wrap is what keeps the check from passing an untouched copy
    (an untransformed image is 17-33 % similar on the suite's images, 48-88 % with a true difference) and
    makes a lossy re-encoding of a right answer borderline (JPEG: 29-46 %). A single-channel image (mode
    ``L``) counts rows, not pixels, and fails: also the benchmark's behaviour.
    """
    how = _choice(check, "inverse", INVERSES)
    least, tolerance = _number(check, "min_similar_fraction"), _number(check, "per_channel_tolerance")
    output_path, reference_path = _file(check, root), _file(check, root, "ref")
    import numpy as np

    with _open_image(output_path) as output, _open_image(reference_path) as reference:
        restored = _invert(output, how)
        if reference.size != restored.size:
            reference = reference.resize(restored.size)
        if reference.mode != restored.mode:
            reference = reference.convert(restored.mode)
        mine, theirs = np.array(restored), np.array(reference)
    within = np.all(np.abs(mine - theirs) <= 255 * tolerance, axis=-1)
    fraction = float(np.count_nonzero(within) / (mine.shape[0] * mine.shape[1]))
    return fraction >= least, f"{fraction:.3f} of the pixels match after {check['inverse']}, want >= {least:g}"


def image_tiles_aspect(check: dict[str, Any], root: Path) -> Outcome:
    """The images of ``paths``, put side by side (``concat`` horizontal; vertical stacks them), have the
    aspect ratio (width / height) of ``ref`` within ``max_ratio_diff``. Only sizes are read."""
    concat = _choice(check, "concat", {"horizontal": "horizontal", "vertical": "vertical"})
    most = _number(check, "max_ratio_diff")
    sizes = []
    for path in _files(check, root):
        with _open_image(path) as tile:
            sizes.append(tile.size)
    with _open_image(_file(check, root, "ref")) as reference:
        ref_width, ref_height = reference.size
    widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
    if concat == "horizontal":
        width, height = sum(widths), max(heights)
    else:
        width, height = max(widths), sum(heights)
    ratio, ref_ratio = width / height, ref_width / ref_height
    passed = abs(ratio - ref_ratio) <= most
    return passed, f"tiles {sizes} make {width}x{height} (ratio {ratio:.3f}); input ratio {ref_ratio:.3f}"


# -- folders -------------------------------------------------------------------------------------------------


def dir_exists(check: dict[str, Any], root: Path) -> Outcome:
    """``path`` is a folder (an empty one passes)."""
    value = check.get("path")
    exists = resolve(root, value).is_dir()
    return exists, f"{value} is a folder" if exists else f"the session did not produce the folder {value}"


def dir_has_ext(check: dict[str, Any], root: Path) -> Outcome:
    """Some entry directly in the folder ``dir`` has a name ending in ``ext`` (sub-folders are not searched,
    as in PyBench's ``os.listdir`` test)."""
    ext = _param(check, "ext", str)
    folder = resolve(root, check.get("dir"), "dir")
    if not folder.is_dir():
        return False, f"the session did not produce the folder {check.get('dir')}"
    names = sorted(entry.name for entry in folder.iterdir())
    found = [name for name in names if name.endswith(ext)]
    return bool(found), f"found {found[0]}" if found else f"no {ext} among {names[:20]}"


# -- audio (wave, numpy, mutagen, pydub) ---------------------------------------------------------------------


def _rms_dbfs_wave_int16(path: Path) -> float:
    """PyBench's loudness: the WAV's frames read as 16-bit samples whatever the sample width, scaled by the
    real width's full scale; RMS in dB (minus infinity for silence)."""
    import wave

    import numpy as np

    with wave.open(str(path), "rb") as wav:
        width = wav.getsampwidth()
        frames = wav.readframes(wav.getnframes())
    samples = np.frombuffer(frames, dtype=np.int16) / 2 ** (8 * width - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(20 * np.log10(np.sqrt(np.mean(samples**2))))


def _dbfs(path: Path) -> float:
    """Loudness of any audio file ffmpeg decodes: pydub's ``dBFS`` (RMS over every sample; -inf for silence)."""
    from pydub import AudioSegment

    return float(AudioSegment.from_file(str(path)).dBFS)


LOUDNESS: dict[str, Callable[[Path], float]] = {"rms_dbfs_wave_int16": _rms_dbfs_wave_int16, "dbfs": _dbfs}
"""Loudness measures by name."""


def _loudness(check: dict[str, Any], root: Path, op: str) -> Outcome:
    measure = _choice(check, "measure", LOUDNESS)
    mine, theirs = measure(_file(check, root)), measure(_file(check, root, "ref"))
    passed = _compare(mine, op, theirs)
    return passed, f"{check['measure']} {mine:.2f} (output) {COMPARISONS[op]} {theirs:.2f} (input): {passed}"


def audio_louder_than_input(check: dict[str, Any], root: Path) -> Outcome:
    """The audio at ``path`` is louder than ``ref`` by ``measure`` (``rms_dbfs_wave_int16``: PyBench's WAV
    reading; ``dbfs``: any format, decoded by ffmpeg)."""
    return _loudness(check, root, "gt")


def audio_quieter_than_input(check: dict[str, Any], root: Path) -> Outcome:
    """The audio at ``path`` is quieter than ``ref`` by ``measure`` (silence is quieter than any sound)."""
    return _loudness(check, root, "lt")


def _replaygain(path: Path, tag: str) -> float:
    """PyBench's reading: the gain in dB of ID3 frame ``tag`` (``-6.5 dB``), 0 when the frame is absent."""
    from mutagen.mp3 import MP3

    tags = MP3(str(path)).tags
    frame = tags.get(tag) if tags is not None else None
    return float(frame.text[0].split()[0]) if frame else 0.0


def mp3_replaygain_lower_than_input(check: dict[str, Any], root: Path) -> Outcome:
    """The ReplayGain of the MP3 at ``path`` (ID3 frame ``tag``) is lower than that of ``ref``. ffmpeg and
    pydub never write the frame, so both read 0 and a correct, silent output fails: PyBench's behaviour."""
    tag = _param(check, "tag", str)
    mine, theirs = _replaygain(_file(check, root), tag), _replaygain(_file(check, root, "ref"), tag)
    return mine < theirs, f"{tag} {mine:g} dB (output) < {theirs:g} dB (input): {mine < theirs}"


def _mutagen_mp3_length(path: Path) -> float:
    from mutagen.mp3 import MP3

    return float(MP3(str(path)).info.length)


DURATIONS: dict[str, Callable[[Path], float]] = {"mutagen_mp3_length": _mutagen_mp3_length}
"""Duration measures by name (seconds)."""


def audio_shorter_than_input(check: dict[str, Any], root: Path) -> Outcome:
    """The audio at ``path`` lasts less than ``ref`` by ``measure`` (``mutagen_mp3_length``: MP3 frames)."""
    measure = _choice(check, "measure", DURATIONS)
    mine, theirs = measure(_file(check, root)), measure(_file(check, root, "ref"))
    return mine < theirs, f"{mine:.2f} s (output) < {theirs:.2f} s (input): {mine < theirs}"


# -- running -------------------------------------------------------------------------------------------------

KINDS: dict[str, Callable[[dict[str, Any], Path], Outcome]] = {
    "csv_no_duplicates": csv_no_duplicates,
    "csv_no_nulls": csv_no_nulls,
    "csv_no_iqr_outliers": csv_no_iqr_outliers,
    "table_no_numeric_strings": table_no_numeric_strings,
    "csv_column_datetime": csv_column_datetime,
    "excel_readable": excel_readable,
    "csv_rows": csv_rows,
    "csv_sorted_by": csv_sorted_by,
    "pickle_loads": pickle_loads,
    "model_predicts": model_predicts,
    "image_stat_vs_input": image_stat_vs_input,
    "image_size": image_size,
    "image_square": image_square,
    "image_mode": image_mode,
    "image_dark_fraction": image_dark_fraction,
    "image_matches_input_after_inverse": image_matches_input_after_inverse,
    "image_tiles_aspect": image_tiles_aspect,
    "dir_exists": dir_exists,
    "dir_has_ext": dir_has_ext,
    "audio_louder_than_input": audio_louder_than_input,
    "audio_quieter_than_input": audio_quieter_than_input,
    "mp3_replaygain_lower_than_input": mp3_replaygain_lower_than_input,
    "audio_shorter_than_input": audio_shorter_than_input,
}
"""The file-opening check kinds by name."""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 3] + "..."


def run_one(check: object, root: Path) -> dict[str, Any]:
    """Run one check; never raises. Returns ``{"kind", "passed", "detail"}``."""
    if not isinstance(check, dict):
        return {"kind": "", "passed": False, "detail": f"malformed check: not an object: {check!r}"[:200]}
    kind = str(check.get("kind", ""))
    function = KINDS.get(kind)
    if function is None:
        return {"kind": kind, "passed": None, "detail": f"check kind {kind!r} is not a file check"}
    try:
        passed, detail = function(check, root)
    except CheckFailed as exc:
        passed, detail = False, str(exc)
    except MalformedCheck as exc:
        passed, detail = False, f"malformed check: {exc}"
    except (Exception, SystemExit) as exc:
        passed, detail = False, f"check crashed: {type(exc).__name__}: {exc}"
    return {"kind": kind, "passed": bool(passed), "detail": _cut(str(detail))}


def run(checks: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
    """Run ``checks`` on the files under ``root``; never raises.

    Returns:
        One ``{"kind", "passed", "detail"}`` per check, in order: ``passed`` True or False when the check ran
        (False with ``check crashed: <ExcType>: <message>`` when it raised), None for an unknown kind.
    """
    base = Path(root)
    return [run_one(check, base) for check in (checks if isinstance(checks, list) else [])]


def _divert_stdout() -> int:
    """Keep the real stdout for the result line; send whatever else writes to it (libraries) to stderr."""
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)
    return result_fd


def _forbid_inspection() -> None:
    """Make this process non-dumpable: processes of the same user (a pickle's code in its child interpreter)
    can then neither read its memory nor open its file descriptors under ``/proc``. Best effort."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main(argv: list[str] | None = None) -> int:
    """``python file_checks.py request.json``: run the request's checks and print one JSON line,
    ``{"results": [...]}`` (``{"error": ...}`` and exit code 2 when the request cannot be read)."""
    args = sys.argv[1:] if argv is None else argv
    result_fd = _divert_stdout()
    _forbid_inspection()
    code = 0
    try:
        request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        line = json.dumps({"results": run(request["checks"], request["root"])})
    except Exception as exc:
        line, code = json.dumps({"error": f"bad request: {type(exc).__name__}: {exc}"}), 2
    data = (line + "\n").encode()
    while data:
        data = data[os.write(result_fd, data) :]
    return code


if __name__ == "__main__":
    sys.exit(main())
