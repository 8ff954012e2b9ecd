"""The two gradings of a task: ``original`` (the benchmark's behaviour, bugs included) and ``fixed`` (its intent).

The suite's ``checks.json`` writes down what PyBench's own unit test for each task verifies, paths and all,
and its ``notes`` say where that test is broken. This module is the project's reading of those notes:

- ``original`` runs the checks as written, and where the benchmark's test cannot give any other outcome
  (an assertion on a DataFrame, a NameError, a discarded ``os.path.exists``) it gives that outcome, so a
  score compares with the paper's. Where a check as written is stricter than the test (task 140's folder
  check; the test is ``os.path.exists``, which a plain file passes), it runs what the test runs. It also sees
  the shared ``./output`` of the benchmark's harness: a check that names another task's file looks at what that
  task of the evaluation produced (``grader.shared_output``).
- ``fixed`` follows the task's query: the path the query names, the right inverse transform, the direction
  the statistic really moves, a loudness measured on the file the query asks for. A task whose test needs
  what is not here (a reference file that was never published, the internet) is ``ungradable``, not failed.

Both gradings read the same answer checks; what differs is the answer they read (see ``grader.grading``).
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Grading(StrEnum):
    ORIGINAL = "original"
    FIXED = "fixed"


class Forced(StrEnum):
    """An outcome the benchmark's test always gives, whatever the session did."""

    ALWAYS_FAILS = "always_fails"
    ALWAYS_PASSES = "always_passes"


@dataclass(frozen=True)
class TaskVariant:
    """How one task's gradings depart from its checks as written.

    ``original``: the outcome the benchmark's broken test always gives (``None``: run the checks).
    ``original_checks``: the checks of the original grading, where the benchmark's test checks something other
    than the checks as written (``None``: the checks as written).
    ``fixed_checks``: the checks of the fixed grading (``None``: the checks as written).
    ``ungradable``: why the fixed grading cannot grade the task here (empty: it can).
    """

    why: str
    original: Forced | None = None
    original_checks: list[dict[str, Any]] | None = None
    fixed_checks: list[dict[str, Any]] | None = None
    ungradable: str = ""


_SAVED_MODELS = {
    40: ("./output/40.pkl", "./data/IRIS.csv"),
    41: ("./output/41.pkl", "./data/classify.csv"),
    47: ("./output/47.pkl", "./data/Classify_Orange Quality Data.csv"),
    48: ("./output/48.pkl", "./data/World University Rankings 2023.csv"),
    49: ("./output/49.pkl", "./data/regress_stocks.csv"),
    50: ("./output/50.pkl", "./data/Farm_Weather_Data.xlsx"),
    51: ("./output/51.pkl", "./data/Google.csv"),
}
"""Tasks that ask for a model trained on their input and saved to a ``.pkl`` path (PyBench's test only opens
it with ``pickle.load``): the path, and the input the model must predict on in the fixed grading."""

_SAVED_MODEL_WHY = (
    "the query asks for a trained model saved to the path, and PyBench's test only unpickles it (an int that a "
    "pickle's code returns passes): the fixed grading asks for a fitted model that predicts on the task's data. "
    "joblib.dump (scikit-learn's documented way to save a model) writes numpy arrays outside the pickle stream, "
    "so PyBench's pickle.load fails it: joblib.load too"
)

VARIANTS: dict[int, TaskVariant] = {
    11: TaskVariant(
        why="the test asserts on a DataFrame (`assert df`), which raises ValueError: it always fails",
        original=Forced.ALWAYS_FAILS,
    ),
    20: TaskVariant(
        why="the test asserts os.path.exists(key_path) with key_path undefined (NameError): it always fails",
        original=Forced.ALWAYS_FAILS,
    ),
    32: TaskVariant(
        why="53 rows but 52 distinct Super Bowls (SB 1 aired on two networks): either count answers the query",
        fixed_checks=[{"kind": "answer_contains_any", "strings": ["52", "53"]}],
    ),
    59: TaskVariant(
        why="the query says ./output/59.txt (for a word cloud image); the test checks ./output/59.png: either",
        fixed_checks=[{"kind": "file_exists_any", "paths": ["./output/59.txt", "./output/59.png"]}],
    ),
    63: TaskVariant(
        why="the test discards the result of os.path.exists: it always passes",
        original=Forced.ALWAYS_PASSES,
    ),
    68: TaskVariant(
        why="the test checks ./output/67.png; the query asks for ./output/68.png",
        fixed_checks=[{"kind": "file_exists", "paths": ["./output/68.png"]}],
    ),
    74: TaskVariant(
        why="the query asks for ./output/74.xlsx; the test checks ./output/74.png, so a correct solution fails",
        fixed_checks=[{"kind": "excel_readable", "paths": ["./output/74.xlsx"]}],
    ),
    81: TaskVariant(
        why="the inverse of a vertical flip is a vertical flip, not a 180-degree rotation",
        fixed_checks=[
            {
                "kind": "image_matches_input_after_inverse",
                "path": "./output/81.png",
                "ref": "./data/81.jpeg",
                "inverse": "flip_top_bottom",
                "min_similar_fraction": 0.4,
                "per_channel_tolerance": 0.5,
            }
        ],
    ),
    82: TaskVariant(
        why="the test is a copy of task 81's (81.png against 81.jpeg); 82.png is never inspected",
        fixed_checks=[
            {
                "kind": "image_matches_input_after_inverse",
                "path": "./output/82.png",
                "ref": "./data/82.jpeg",
                "inverse": "flip_top_bottom",
                "min_similar_fraction": 0.4,
                "per_channel_tolerance": 0.5,
            }
        ],
    ),
    99: TaskVariant(
        why="adding Poisson noise raises the Laplacian variance (3660 -> 4732 measured); the test wants it lower",
        fixed_checks=[
            {
                "kind": "image_stat_vs_input",
                "path": "./output/99.png",
                "ref": "./data/99.jpeg",
                "stat": "laplacian_var",
                "op": "gt",
            }
        ],
    ),
    128: TaskVariant(why="the task needs the internet (Baidu Baike)", ungradable="needs the internet (Baidu Baike)"),
    129: TaskVariant(why="the task needs the internet (Hugging Face)", ungradable="needs the internet (Hugging Face)"),
    140: TaskVariant(
        why="the test is os.path.exists('./output/140'): a plain file of that name passes it as a folder does; the "
        "query asks for a folder of files, which the fixed grading keeps (an empty folder still passes both)",
        original_checks=[{"kind": "path_exists", "path": "./output/140"}],
    ),
    146: TaskVariant(
        why="the test reads ./output/146.wav against a reference .wav that was never published; the query asks "
        "for ./output/146.mp3 louder than the input mp3",
        fixed_checks=[
            {
                "kind": "audio_louder_than_input",
                "path": "./output/146.mp3",
                "ref": "./data/Ghostrifter Official - Serenity.mp3",
                "measure": "dbfs",
            }
        ],
    ),
    **{
        index: TaskVariant(
            why=_SAVED_MODEL_WHY,
            fixed_checks=[{"kind": "model_predicts", "path": path, "data": data, "joblib": True}],
        )
        for index, (path, data) in _SAVED_MODELS.items()
    },
    149: TaskVariant(
        why="the test compares ReplayGain tags that ffmpeg and pydub never write (0 > 0 fails a correct, silent "
        "output); the query asks for the volume decreased by 100%, i.e. silence",
        fixed_checks=[
            {
                "kind": "audio_quieter_than_input",
                "path": "./output/149.mp3",
                "ref": "./data/Ghostrifter Official - Serenity.mp3",
                "measure": "dbfs",
            }
        ],
    ),
}
"""The departures, by task index; every other task is graded by its checks as written under both gradings."""


def checks_for(task_index: int, checks: list[dict[str, Any]], grading: Grading) -> list[dict[str, Any]]:
    """The checks ``grading`` runs for a task whose checks as written are ``checks``."""
    variant = VARIANTS.get(task_index)
    if grading is Grading.FIXED and variant is not None and variant.fixed_checks is not None:
        return variant.fixed_checks
    if grading is Grading.ORIGINAL and variant is not None and variant.original_checks is not None:
        return variant.original_checks
    return checks


def forced_outcome(task_index: int, grading: Grading) -> Forced | None:
    """The outcome ``grading`` gives the task whatever the session did, if any (only ``original`` has some)."""
    variant = VARIANTS.get(task_index)
    return variant.original if grading is Grading.ORIGINAL and variant is not None else None


def ungradable_reason(task_index: int, grading: Grading) -> str:
    """Why ``grading`` cannot grade the task here (empty when it can; ``original`` grades everything)."""
    variant = VARIANTS.get(task_index)
    return variant.ungradable if grading is Grading.FIXED and variant is not None else ""
