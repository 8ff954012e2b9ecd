"""Both gradings on recorded sessions, through real grading sandboxes: where the benchmark's tests are broken,
``original`` keeps their outcome and ``fixed`` follows the task.

Each session is a recorded trajectory of the suite's ``trajectory.jsonl`` with the files a correct solution
produces, made by a script in a container of the sandbox image from the suite's own inputs.
"""

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from grader import session_files
from grader.file_checks import checker_sources
from grader.grading import grade
from services.pybench.recordings import recording_of
from services.pybench.suite import Suite, load_suite
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE
from services.sandbox.grading_docker import run_file_checks
from services.trajectory import EndReason, Message, Trajectory
from services.verdict import CheckResult, VerdictStatus
from tests.servers import files_made_in_sandbox_image

pytestmark = pytest.mark.docker

IMAGE = DEFAULT_SANDBOX_IMAGE
CHECKER = checker_sources()

SOLUTIONS = r"""
import base64, io, sys, tarfile
import numpy as np
import pandas as pd
from PIL import Image
from pydub import AudioSegment
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = {}
def keep(name, write):
    buffer = io.BytesIO(); write(buffer); out[name] = buffer.getvalue()

frame = pd.read_csv("/suite/data/Turkey_Syria_Earthquake.csv")
keep("11/11.xlsx", lambda b: frame.to_excel(b, index=False))
stats = pd.read_csv("/suite/data/agents_abilities_stat.csv")
plt.bar(range(len(stats)), range(len(stats))); keep("20/20.png", lambda b: plt.savefig(b, format="png"))
picture = np.asarray(Image.open("/suite/data/99.jpeg").convert("RGB")).astype(float)
noisy = np.clip(np.random.default_rng(0).poisson(picture), 0, 255).astype("uint8")
keep("99/99.png", lambda b: Image.fromarray(noisy).save(b, format="PNG"))
song = AudioSegment.from_file("/suite/data/Ghostrifter Official - Serenity.mp3")[:20000]
keep("146/146.mp3", lambda b: (song + 1).export(b, format="mp3"))
keep("149/149.mp3", lambda b: (song - 120).export(b, format="mp3"))
import joblib, pickle
from sklearn.compose import make_column_transformer
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder
from sklearn.svm import SVR
iris = pd.read_csv("/suite/data/IRIS.csv")
forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(iris.drop(columns="species"), iris["species"])
keep("40/40.pkl", lambda b: pickle.dump(forest, b))
oranges = pd.read_csv("/suite/data/Classify_Orange Quality Data.csv")
texts = [c for c in oranges.columns if oranges[c].dtype == object]
encode = make_column_transformer((OneHotEncoder(handle_unknown="ignore"), texts), remainder="passthrough")
quality = make_pipeline(encode, RandomForestClassifier(n_estimators=10, random_state=0))
quality.fit(oranges.drop(columns="Quality (1-5)"), oranges["Quality (1-5)"].astype(str))
keep("47/47.pkl", lambda b: joblib.dump(quality, b))
weather = pd.read_excel("/suite/data/Farm_Weather_Data.xlsx").select_dtypes("number").dropna()
ridge = Ridge().fit(weather.iloc[:, :-1].to_numpy(), weather.iloc[:, -1].to_numpy())
keep("50/50.pkl", lambda b: pickle.dump(ridge, b))
google = pd.read_csv("/suite/data/Google.csv")
svm = SVR().fit(google[["Open", "High", "Low"]].to_numpy()[:500], google["Close"].to_numpy()[:500])
keep("51/51.pkl", lambda b: pickle.dump(svm, b))
archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w") as tar:
    for name, data in out.items():
        info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
sys.stdout.write(base64.b64encode(archive.getvalue()).decode())
"""
"""Writes what a correct solution of tasks 11, 20, 40, 47, 50, 51, 99, 146 and 149 saves (task 63 saves nothing
here); the models are scikit-learn's, fitted on a frame (40), in a pipeline saved with joblib (47), on arrays."""


@pytest.fixture(scope="module")
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


@pytest.fixture(scope="module")
def outputs(suite_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Per task, a folder of what its session saved under ./output."""
    made = files_made_in_sandbox_image(docker.from_env(), IMAGE, SOLUTIONS, suite=suite_path)
    root = tmp_path_factory.mktemp("outputs")
    for name, data in made.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    yield root


def recorded(suite_path: Path, index: int) -> Trajectory:
    """The suite's recorded trajectory of task ``index`` as a finished session."""
    recording = recording_of(suite_path / "trajectory.jsonl", index)
    return Trajectory(
        evaluation_id="gradings",
        task_index=index,
        attempt=1,
        messages=[Message.model_validate(m) for m in recording.messages],
        end_reason=EndReason.NO_CODE,
    )


@pytest.mark.parametrize(
    ("index", "original", "fixed"),
    [
        (11, VerdictStatus.FAILED, VerdictStatus.PASSED),  # `assert df` always raises
        (20, VerdictStatus.FAILED, VerdictStatus.PASSED),  # NameError in the test
        (63, VerdictStatus.PASSED, VerdictStatus.FAILED),  # the test discards os.path.exists; nothing was saved
        (99, VerdictStatus.FAILED, VerdictStatus.PASSED),  # noise raises the Laplacian variance
        (146, VerdictStatus.FAILED, VerdictStatus.PASSED),  # the test reads a .wav the query never asked for
        (149, VerdictStatus.FAILED, VerdictStatus.PASSED),  # ReplayGain tags nobody writes
        (40, VerdictStatus.PASSED, VerdictStatus.PASSED),  # a fitted model, plainly pickled
        (47, VerdictStatus.PASSED, VerdictStatus.PASSED),  # joblib.dump: pickle.load gives its first array
        (50, VerdictStatus.PASSED, VerdictStatus.PASSED),
        (51, VerdictStatus.PASSED, VerdictStatus.PASSED),
    ],
)
def test_recorded_sessions_differ_between_the_gradings_exactly_where_the_benchmark_is_broken(
    suite: Suite, suite_path: Path, outputs: Path, index: int, original: VerdictStatus, fixed: VerdictStatus
) -> None:
    task = suite.task(index)
    output_dir = outputs / str(index)

    def run(checks: list[dict[str, Any]]) -> list[CheckResult]:
        return run_file_checks(
            checks, session_files.gather(output_dir, suite, checks), checker=CHECKER, image=IMAGE, timeout_s=120
        )

    produced = sorted(f"./output/{p.name}" for p in output_dir.iterdir()) if output_dir.is_dir() else []
    verdict = grade(task, recorded(suite_path, index), produced, run)
    assert verdict.fixed is not None
    assert (verdict.status, verdict.fixed.status) == (original, fixed), (verdict.reason, verdict.fixed.reason)


class Reduce:
    """Pickles as a call of ``function(*args)``: what a pickle whose ``__reduce__`` runs a command loads to."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


@pytest.mark.parametrize("index", [40, 41, 47, 48, 49, 50, 51])
def test_a_pickle_that_runs_a_command_passes_the_original_grading_only_and_the_fixed_one_refuses_it(
    suite: Suite, suite_path: Path, tmp_path: Path, index: int
) -> None:
    """PyBench's test only unpickles the saved model, so ``original`` passes whatever loads; ``fixed`` wants a
    fitted model that predicts on the task's data, and refuses before it runs a pickle that names anything but a
    model library's class (``os.getpid`` here)."""
    (tmp_path / f"{index}.pkl").write_bytes(pickle.dumps(Reduce(os.getpid)))

    def run(checks: list[dict[str, Any]]) -> list[CheckResult]:
        return run_file_checks(
            checks, session_files.gather(tmp_path, suite, checks), checker=CHECKER, image=IMAGE, timeout_s=120
        )

    verdict = grade(suite.task(index), recorded(suite_path, index), [f"./output/{index}.pkl"], run)
    assert verdict.fixed is not None
    assert (verdict.status, verdict.fixed.status) == (VerdictStatus.PASSED, VerdictStatus.FAILED)
    assert [c.detail for c in verdict.checks] == ["loaded a builtins.int"]
    (refusal,) = [c.detail for c in verdict.fixed.checks]
    assert refusal.startswith("refused: the pickle names posix.getpid, which is not a model library's class"), refusal
