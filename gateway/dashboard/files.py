"""Files a page shows or offers: a session's produced files (found through ``gateway.readmodel``, with the REST
API's path rule) and a task's inputs and reference files (in the suite), answered so that a hostile file can do
nothing in the dashboard's origin.

Produced files are model output. They are answered with a media type chosen here from the name (never sniffed),
``X-Content-Type-Options: nosniff`` and a ``sandbox`` Content-Security-Policy (an SVG or HTML file opened directly
runs no script); only images and audio are answered ``inline``, everything else as an attachment.
"""

from pathlib import Path, PurePosixPath

from fastapi.responses import FileResponse

from services.errors import SuiteError
from services.pybench.suite import Suite
from services.task import Task

IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
    ".svg": "image/svg+xml",
}
AUDIO_TYPES = {
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".ogg": "audio/ogg",
    ".flac": "audio/flac",
    ".m4a": "audio/mp4",
}
TABLE_SUFFIXES = (".csv", ".tsv", ".xlsx")
TEXT_SUFFIXES = (".txt", ".md", ".json", ".py", ".log", ".html", ".htm", ".xml", ".yaml", ".yml")

FILE_POLICY = "default-src 'none'; img-src 'self' data:; media-src 'self'; style-src 'unsafe-inline'; sandbox"
"""The Content-Security-Policy of every file answered: no script, no form, no frame, its own origin sandboxed."""


def kind(name: str) -> str:
    """How a file is shown: ``image``, ``audio``, ``table``, ``text``, ``folder`` or ``other`` (download only)."""
    if name.endswith("/"):
        return "folder"
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in IMAGE_TYPES:
        return "image"
    if suffix in AUDIO_TYPES:
        return "audio"
    if suffix in TABLE_SUFFIXES:
        return "table"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return "other"


def reference_names(task: Task) -> list[str]:
    """The suite files a task's checks compare its output with (their ``ref``), in order, without repeats."""
    found: list[str] = []
    for check in task.checks:
        ref = check.get("ref")
        if isinstance(ref, str) and ref not in found:
            found.append(ref)
    return found


def suite_path(suite: Suite, task: Task, name: str) -> Path | None:
    """The suite file ``name`` if the task names it (an input or a check's reference) and it exists, else None.
    Raises nothing: a name outside the suite folder is None."""
    allowed = {item.path for item in task.inputs} | set(reference_names(task))
    if name not in allowed:
        return None
    try:
        path = suite.input_file(name)
    except SuiteError:  # the name leaves the suite folder
        return None
    return path if path.is_file() else None


def file_response(path: Path, *, download: bool) -> FileResponse:
    """Answer a stored file safely: images and audio inline (unless ``download``), everything else as an
    attachment, with a media type from its suffix and the sandboxing headers. Raises nothing."""
    suffix = path.suffix.lower()
    media = IMAGE_TYPES.get(suffix) or AUDIO_TYPES.get(suffix)
    inline = media is not None and not download
    return FileResponse(
        path,
        media_type=media if inline and media else "application/octet-stream",
        filename=path.name,
        content_disposition_type="inline" if inline else "attachment",
        headers={
            "Content-Security-Policy": FILE_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private",
        },
    )
