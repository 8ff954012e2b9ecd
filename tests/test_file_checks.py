"""The file-opening check kinds, run in real grading sandboxes (containers of the sandbox image).

The fixtures (tables, images, pickles, audio) are made by one container of the sandbox image, which has
numpy, pandas, PIL, pydub and ffmpeg (the host need not). Every kind's passing and failing cases then run in
one ``run_file_checks`` call over one set of files; only the timeout needs a container of its own. The
network probes aim at loopback inside the sandbox and at this machine's own Docker bridge address (a UDP
``connect``, which sends nothing); no test aims at an outside address.
"""

import ipaddress
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.client
import pytest

from grader import file_checks
from services.errors import SandboxStartError
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, GRADING_ROLE, ROLE_LABEL
from services.sandbox.grading import parse_results, workspace_name
from services.sandbox.grading_docker import reap, run_file_checks
from services.verdict import CheckResult
from tests.servers import files_made_in_sandbox_image

pytestmark = pytest.mark.docker

IMAGE = DEFAULT_SANDBOX_IMAGE
CHECKER = file_checks.checker_sources()
GRADING_LABEL = f"{ROLE_LABEL}={GRADING_ROLE}"

GENERATOR = r"""
import base64, io, os, pickle, tarfile, tempfile
import numpy as np
import pandas as pd
from PIL import Image, ImageFilter
from pydub import AudioSegment
from pydub.generators import Sine
from mutagen.id3 import ID3, TXXX
from sklearn.linear_model import LinearRegression
from sklearn.ensemble import RandomForestClassifier

files = {}

def png(name, image):
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    files[name] = buffer.getvalue()

# An input of noise, and outputs the tasks' transforms make of it (and one left untouched).
noise = Image.fromarray(np.random.default_rng(7).integers(0, 256, (60, 90, 3), dtype=np.uint8))
png("data/noise.png", noise)
png("output/rotated_left.png", noise.rotate(90, expand=True))
png("output/turned.png", noise.rotate(180, expand=True))
png("output/mirrored.png", noise.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
png("output/upside_down.png", noise.transpose(Image.Transpose.FLIP_TOP_BOTTOM))
png("output/untouched.png", noise)
png("output/untouched_grey.png", noise.convert("L"))

# A colourful, sharp input, and outputs darker, flatter, greyer and blurred than it.
y, x = np.mgrid[0:64, 0:64]
photo = np.stack([x * 4, y * 4, 255 - (x + y) * 2], axis=-1).astype(np.uint8)
photo[::8] = 255
reference = Image.fromarray(photo)
png("data/photo.png", reference)
png("output/darker.png", Image.fromarray((photo * 0.5).astype(np.uint8)))
png("output/flatter.png", Image.fromarray((photo * 0.2 + 100).astype(np.uint8)))
png("output/greyer.png", reference.convert("L").convert("RGB"))
png("output/blurred.png", reference.filter(ImageFilter.GaussianBlur(3)))
png("output/photo_rgba.png", reference.convert("RGBA"))

png("output/224.png", Image.new("RGB", (224, 224)))
png("output/wide.png", Image.new("RGB", (200, 100)))
png("output/grey.png", Image.new("L", (50, 50), 128))
png("output/dark.png", Image.new("RGB", (40, 40), (10, 10, 10)))
png("output/white.png", Image.new("RGB", (40, 40), (250, 250, 250)))
png("data/strip.png", Image.new("RGB", (400, 100)))
for i in range(1, 5):
    png(f"output/column_{i}.png", Image.new("RGB", (100, 100)))
    png(f"output/band_{i}.png", Image.new("RGB", (400, 25)))

def excel(name, frame):
    buffer = io.BytesIO()
    frame.to_excel(buffer, index=False)
    files[name] = buffer.getvalue()

excel("output/numbers.xlsx", pd.DataFrame({"network": ["NBC", "CBS"], "viewers": [1.5, 2.5]}))
excel("output/strings.xlsx", pd.DataFrame({"network": ["NBC", "CBS"], "viewers": ["1,500", "2,500"]}))

files["output/model.pkl"] = pickle.dumps(LinearRegression().fit([[0.0], [1.0], [2.0]], [0.0, 1.0, 2.0]))

def joblib_dump(name, **options):
    import joblib
    buffer = io.BytesIO()
    forest = RandomForestClassifier(n_estimators=3, random_state=0).fit([[0.0], [1.0], [2.0]], [0, 1, 1])
    joblib.dump(forest, buffer, **options)
    files[name] = buffer.getvalue()

joblib_dump("output/joblib_model.pkl")
joblib_dump("output/joblib_zipped.pkl", compress=3)

# A task's table (numbers and a label), and models of it: fitted on the frame, on an array, in a pipeline that
# encodes a text column itself, and one never fitted.
from sklearn.compose import make_column_transformer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder
rng = np.random.default_rng(3)
measures = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
flowers = pd.DataFrame(rng.normal(5, 1, (30, 4)).round(2), columns=measures)
flowers["colour"] = ["red", "blue", "white"] * 10
flowers["species"] = ["setosa", "virginica"] * 15
flowers.loc[3, "petal_width"] = None
files["data/flowers.csv"] = flowers.to_csv(index=False).encode()
clean = flowers.dropna()
numbers = clean.drop(columns=["colour", "species"])
forest = RandomForestClassifier(n_estimators=3, random_state=0).fit(numbers, clean["species"])
files["output/fitted_forest.pkl"] = pickle.dumps(forest)
on_array = LinearRegression().fit(numbers.to_numpy()[:, :2], clean["petal_length"].to_numpy())
files["output/fitted_array.pkl"] = pickle.dumps(on_array)
encode = make_column_transformer((OneHotEncoder(handle_unknown="ignore"), ["colour"]), remainder="passthrough")
pipeline = make_pipeline(encode, LogisticRegression(max_iter=500))
pipeline.fit(clean.drop(columns=["species"]), clean["species"])
files["output/fitted_pipeline.pkl"] = pickle.dumps(pipeline)
files["output/unfitted_forest.pkl"] = pickle.dumps(RandomForestClassifier())

def wav(name, amplitude):
    t = np.arange(8000) / 8000
    samples = (amplitude * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2")
    segment = AudioSegment(samples.tobytes(), frame_rate=8000, sample_width=2, channels=1)
    buffer = io.BytesIO()
    segment.export(buffer, format="wav")
    files[name] = buffer.getvalue()

wav("data/tone.wav", 0.3)
wav("output/louder.wav", 0.6)
wav("output/quieter.wav", 0.1)

def mp3(name, segment, gain=None):
    path = os.path.join(tempfile.mkdtemp(), "a.mp3")
    segment.export(path, format="mp3", bitrate="64k")
    if gain is not None:
        tags = ID3()
        tags.add(TXXX(encoding=3, desc="replaygain_track_gain", text=[gain]))
        tags.save(path)
    with open(path, "rb") as file:
        files[name] = file.read()

tone = Sine(440).to_audio_segment(duration=1500, volume=-12).set_channels(1)
mp3("data/tone.mp3", tone, gain="-3.00 dB")
mp3("output/louder.mp3", tone + 9)
mp3("output/silent.mp3", AudioSegment.silent(duration=1500, frame_rate=44100))
mp3("output/lowered.mp3", tone - 6, gain="-9.00 dB")
mp3("output/untagged.mp3", tone - 6)
mp3("output/cut.mp3", tone[:500])

buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode="w") as tar:
    for name, data in files.items():
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
print(base64.b64encode(buffer.getvalue()).decode())
"""
"""Makes the binary fixtures inside the sandbox image; prints them as one base64 tar line."""


class Reduce:
    """Pickles as a call of ``function(*args)``: what a hostile pickle runs when it is loaded."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


def network_probe(bridge_gateway: str) -> str:
    """Code that raises unless the box has loopback and nothing else."""
    return f"""
import errno, socket
names = [name for _, name in socket.if_nameindex()]
assert names == ["lo"], f"interfaces: {{names}}"
with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    socket.create_connection(server.getsockname(), timeout=2).close()
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    try:
        probe.connect(("{bridge_gateway}", 9))
    except OSError as exc:
        assert exc.errno == errno.ENETUNREACH, exc
    else:
        raise AssertionError("a route to the host's Docker bridge")
"""


FORGER = """
import json
forged = json.dumps({"results": [{"kind": "csv_no_duplicates", "passed": True, "detail": "forged"}] * 99})
for target in ("/proc/1/fd/1", "/proc/1/fd/2"):
    try:
        with open(target, "w") as stream:
            stream.write(forged + "\\n")
    except OSError:
        pass
print(forged)
"""
"""Code that tries to write a result line where the checker writes its own."""


PREEXISTING: set[tuple[str, str]] = set()
"""Grading containers and volumes that were there before these tests (a live stack's, a crashed grader's): the
tests neither count nor remove them."""


def ours(engine: Any) -> set[tuple[str, str]]:
    """The grading containers and volumes there now that were not there before these tests."""
    containers = {("container", c.name) for c in engine.containers.list(all=True, filters={"label": GRADING_LABEL})}
    volumes = {("volume", v.name) for v in engine.volumes.list(filters={"label": GRADING_LABEL})}
    return (containers | volumes) - PREEXISTING


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = docker.client.from_env()
    if not client.images.list(name=IMAGE):
        pytest.fail(f"the sandbox image {IMAGE} is missing: build it with `make images`")
    PREEXISTING.update(ours(client))
    yield client
    assert not ours(client), f"grading containers or volumes left behind: {sorted(ours(client))}"
    client.close()


def make_fixtures(engine: Any) -> dict[str, bytes]:
    """Run GENERATOR in a container of the sandbox image (no network, read-only root) and unpack its tar."""
    return files_made_in_sandbox_image(engine, IMAGE, GENERATOR, timeout_s=120)


TEXT_FILES = {
    "output/unique.csv": b"a,b\n1,2\n3,4\n",
    "output/repeated.csv": b"a,b\n1,2\n1,2\n",
    "output/holes.csv": b"a,b\n1,\n3,4\n",
    "output/tame.csv": b"x,n\n" + b"".join(b"%d.5,%d\n" % (i, i) for i in range(1, 11)),
    "output/wild.csv": b"x,n\n" + b"".join(b"%d.5,%d\n" % (i, i) for i in range(1, 11)) + b"1000.5,5\n",
    "output/amounts.csv": b'network,amount\nNBC,"1,500"\nCBS,"2,500"\n',
    "output/dates.csv": b"Start Date,Runs\n2020-01-01,10\n2021-02-03,20\n",
    "output/not_dates.csv": b"Start Date,Runs\n2020-01-01,10\nsoon,20\n",
    "output/sorted.csv": b"viewers,cost\n10,1\n10,2\n7,0\n5,9\n",
    "output/unsorted.csv": b"viewers,cost\n10,2\n10,1\n7,0\n5,9\n",
    "output/corrupt.png": b"\x89PNG\r\n\x1a\nnot really",
    "output/corrupt.xls": b"PK\x03\x04 not a workbook",
    "output/140/": b"",
    "output/141/index.html": b"<html></html>",
    "output/142/game.js": b"",
    "output/142/site/index.html": b"<html></html>",
    "output/model.txt": b"not a pickle",
    "data/面壁 智能.csv": b"a\n1\n2\n",
}


def case(expected: bool | None, kind: str, **params: Any) -> tuple[bool | None, dict[str, Any]]:
    return expected, {"kind": kind, **params}


def suite_cases() -> list[tuple[bool | None, dict[str, Any]]]:
    """(expected ``passed``, check) for every kind, passing and failing, plus crashes and refusals."""
    outliers = {"k": 1.5, "dtypes": ["float64", "int64"]}
    by_two = {"by": ["viewers", "cost"], "ascending": [False, True]}
    photo = {"ref": "./data/photo.png"}
    tiles = {"ref": "./data/strip.png", "concat": "horizontal", "max_ratio_diff": 0.1}
    wave = {"ref": "./data/tone.wav", "measure": "rms_dbfs_wave_int16"}
    mp3 = {"ref": "./data/tone.mp3", "measure": "dbfs"}
    gain = {"ref": "./data/tone.mp3", "tag": "TXXX:replaygain_track_gain"}
    length = {"measure": "mutagen_mp3_length"}
    flowers = {"data": "./data/flowers.csv"}

    def undone(expected: bool, path: str, inverse: str) -> tuple[bool | None, dict[str, Any]]:
        similar = {"ref": "./data/noise.png", "min_similar_fraction": 0.4, "per_channel_tolerance": 0.5}
        return case(expected, "image_matches_input_after_inverse", path=path, inverse=inverse, **similar)

    return [
        case(True, "csv_no_duplicates", path="./output/unique.csv"),
        case(False, "csv_no_duplicates", path="./output/repeated.csv"),
        case(True, "csv_no_nulls", path="./output/unique.csv"),
        case(False, "csv_no_nulls", path="./output/holes.csv"),
        case(True, "csv_no_iqr_outliers", path="./output/tame.csv", **outliers),
        case(False, "csv_no_iqr_outliers", path="./output/wild.csv", **outliers),
        case(True, "table_no_numeric_strings", paths=["./output/numbers.xlsx", "./output/unique.csv"]),
        case(False, "table_no_numeric_strings", paths=["./output/numbers.xlsx", "./output/amounts.csv"]),
        case(False, "table_no_numeric_strings", paths=["./output/strings.xlsx", "./output/unique.csv"]),
        case(True, "csv_column_datetime", path="./output/dates.csv", column="Start Date"),
        case(False, "csv_column_datetime", path="./output/not_dates.csv", column="Start Date"),
        case(False, "csv_column_datetime", path="./output/dates.csv", column="End Date"),
        case(True, "excel_readable", paths=["./output/11.xls", "./output/numbers.xlsx"]),
        case(False, "excel_readable", paths=["./output/corrupt.xls", "./output/11.xlsx"]),
        case(True, "csv_rows", path="./output/unique.csv", n=2),
        case(False, "csv_rows", path="./output/unique.csv", n=4),
        case(True, "csv_rows", path="./data/面壁 智能.csv", n=2),
        case(True, "csv_sorted_by", path="./output/sorted.csv", **by_two),
        case(False, "csv_sorted_by", path="./output/unsorted.csv", **by_two),
        case(True, "csv_sorted_by", path="./output/unsorted.csv", by=["viewers"], ascending=[False]),  # a tie
        case(False, "csv_sorted_by", path="./output/sorted.csv", by=["viewers"], ascending=[True]),
        case(True, "pickle_loads", path="./output/model.pkl"),
        case(True, "pickle_loads", path="./output/plain.pkl"),
        case(False, "pickle_loads", path="./output/model.txt"),
        case(True, "pickle_loads", path="./output/network_probe.pkl"),
        case(True, "pickle_loads", path="./output/forger.pkl"),
        case(False, "pickle_loads", path="./output/joblib_zipped.pkl"),  # not a plain pickle: PyBench fails it
        case(True, "pickle_loads", path="./output/joblib_zipped.pkl", joblib=True),
        case(True, "pickle_loads", path="./output/joblib_model.pkl", joblib=True),
        case(True, "pickle_loads", path="./output/model.pkl", joblib=True),
        case(False, "pickle_loads", path="./output/model.txt", joblib=True),
        case(False, "pickle_loads", path="./output/memory_hog.pkl"),
        case(True, "pickle_loads", path="./output/getpid.pkl"),  # an int: PyBench's test asks no more
        case(True, "model_predicts", path="./output/fitted_forest.pkl", **flowers),
        case(True, "model_predicts", path="./output/fitted_array.pkl", **flowers),
        case(True, "model_predicts", path="./output/fitted_pipeline.pkl", **flowers),
        case(True, "model_predicts", path="./output/joblib_zipped.pkl", joblib=True, **flowers),
        case(False, "model_predicts", path="./output/joblib_zipped.pkl", **flowers),  # joblib not allowed
        case(False, "model_predicts", path="./output/getpid.pkl", joblib=True, **flowers),
        case(False, "model_predicts", path="./output/unfitted_forest.pkl", **flowers),
        case(False, "model_predicts", path="./output/plain.pkl", **flowers),
        case(False, "model_predicts", path="./output/model.txt", **flowers),
        case(False, "model_predicts", path="./output/fitted_forest.pkl", data="./data/no-such.csv"),
        case(True, "image_size", path="./output/224.png", width=224, height=224),
        case(False, "image_size", path="./output/wide.png", width=224, height=224),
        case(True, "image_square", path="./output/224.png"),
        case(False, "image_square", path="./output/wide.png"),
        case(True, "image_mode", path="./output/grey.png", mode="L"),
        case(False, "image_mode", path="./output/224.png", mode="L"),
        case(True, "image_dark_fraction", path="./output/dark.png", gray_max=50, min_fraction_exclusive=0.5),
        case(False, "image_dark_fraction", path="./output/white.png", gray_max=50, min_fraction_exclusive=0.25),
        case(True, "image_stat_vs_input", path="./output/darker.png", stat="mean_gray", op="lt", **photo),
        case(False, "image_stat_vs_input", path="./output/darker.png", stat="mean_gray", op="gt", **photo),
        case(True, "image_stat_vs_input", path="./output/flatter.png", stat="std_gray", op="lt", **photo),
        case(False, "image_stat_vs_input", path="./output/flatter.png", stat="std_gray", op="gt", **photo),
        case(True, "image_stat_vs_input", path="./output/greyer.png", stat="mean_hsv_s", op="lt", **photo),
        case(False, "image_stat_vs_input", path="./output/greyer.png", stat="mean_hsv_s", op="gt", **photo),
        case(True, "image_stat_vs_input", path="./output/photo_rgba.png", stat="mean_hsv_s", op="ge", **photo),
        case(True, "image_stat_vs_input", path="./output/blurred.png", stat="laplacian_var", op="lt", **photo),
        case(False, "image_stat_vs_input", path="./output/blurred.png", stat="laplacian_var", op="gt", **photo),
        undone(True, "./output/rotated_left.png", "rotate_ccw_270_expand"),
        undone(False, "./output/untouched.png", "rotate_ccw_270_expand"),
        undone(True, "./output/turned.png", "rotate_180_expand"),
        undone(True, "./output/mirrored.png", "flip_left_right"),
        undone(False, "./output/untouched.png", "flip_left_right"),
        undone(True, "./output/upside_down.png", "flip_top_bottom"),
        undone(False, "./output/untouched_grey.png", "flip_left_right"),  # one channel: PyBench counts rows
        case(True, "image_tiles_aspect", paths=[f"./output/column_{i}.png" for i in range(1, 5)], **tiles),
        case(False, "image_tiles_aspect", paths=[f"./output/band_{i}.png" for i in range(1, 5)], **tiles),
        case(True, "dir_exists", path="./output/140"),
        case(True, "dir_exists", path="./output/141/"),
        case(False, "dir_exists", path="./output/151/"),
        case(True, "dir_has_ext", dir="./output/141", ext=".html"),
        case(False, "dir_has_ext", dir="./output/142", ext=".html"),  # only in a sub-folder
        case(False, "dir_has_ext", dir="./output/143", ext=".html"),
        case(True, "audio_louder_than_input", path="./output/louder.wav", **wave),
        case(False, "audio_louder_than_input", path="./output/quieter.wav", **wave),
        case(False, "audio_louder_than_input", path="./output/louder.wav", **{**wave, "ref": "./data/missing.wav"}),
        case(True, "audio_louder_than_input", path="./output/louder.mp3", **mp3),
        case(False, "audio_louder_than_input", path="./output/silent.mp3", **mp3),
        case(True, "audio_quieter_than_input", path="./output/silent.mp3", **mp3),
        case(False, "audio_quieter_than_input", path="./output/louder.mp3", **mp3),
        case(True, "mp3_replaygain_lower_than_input", path="./output/lowered.mp3", **gain),
        case(False, "mp3_replaygain_lower_than_input", path="./output/untagged.mp3", **gain),
        case(
            False,
            "mp3_replaygain_lower_than_input",
            path="./output/silent.mp3",
            **{**gain, "ref": "./output/untagged.mp3"},
        ),
        case(True, "audio_shorter_than_input", path="./output/cut.mp3", ref="./data/tone.mp3", **length),
        case(False, "audio_shorter_than_input", path="./data/tone.mp3", ref="./output/cut.mp3", **length),
        # A corrupt file crashes its check, and only it; paths out of the workspace are refused; unknown kinds wait.
        case(False, "image_size", path="./output/corrupt.png", width=1, height=1),
        case(False, "audio_shorter_than_input", path="./output/corrupt.png", ref="./data/tone.mp3", **length),
        case(False, "csv_rows", path="../request.json", n=1),
        case(False, "csv_rows", path="/etc/passwd", n=1),
        case(False, "csv_rows", path="./output/unique.csv", n="two"),
        case(None, "answer_contains_all", strings=["x"]),
    ]


@dataclass(frozen=True)
class Call:
    """What running every case cost: its wall time, and the grading containers it created."""

    elapsed_s: float
    containers: int


@pytest.fixture(scope="module")
def graded(engine: Any) -> tuple[list[tuple[bool | None, dict[str, Any]]], list[CheckResult], Call]:
    """Every case, run in one grading sandbox over one set of files."""
    config = engine.networks.get("bridge").attrs["IPAM"]["Config"][0]  # this machine's own docker0 address
    bridge = config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    files = {**make_fixtures(engine), **TEXT_FILES}
    files["output/plain.pkl"] = pickle.dumps({"weights": [1.0, 2.0]})
    files["output/network_probe.pkl"] = pickle.dumps(Reduce(exec, network_probe(bridge)))
    files["output/forger.pkl"] = pickle.dumps(Reduce(exec, FORGER))
    files["output/memory_hog.pkl"] = pickle.dumps(Reduce(eval, "b'x' * (3 << 30)"))
    files["output/getpid.pkl"] = pickle.dumps(Reduce(os.getpid))  # runs a command, unpickles to an int
    files["../escaped.csv"] = b"a\n1\n"
    cases = suite_cases()
    since, started = int(time.time()), time.monotonic()
    # A long time limit: 22 of the cases start an interpreter of their own (pickles), on a machine that may be busy.
    results = run_file_checks([check for _, check in cases], files, checker=CHECKER, timeout_s=240)
    elapsed = time.monotonic() - started
    created = engine.events(
        since=since,
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "create", "label": GRADING_LABEL},
    )
    return cases, results, Call(elapsed_s=elapsed, containers=len(list(created)))


def test_every_file_check_kind_of_the_suite_has_a_passing_and_a_failing_case(graded: Any, suite_path: Path) -> None:
    cases, _, _ = graded
    in_process = {"answer_contains_all", "answer_contains_any", "file_exists"}
    suite = json.loads((suite_path / "checks.json").read_text(encoding="utf-8"))
    kinds = {check["kind"] for task in suite for check in task["checks"]} - in_process
    assert kinds <= set(file_checks.KINDS)
    for kind in file_checks.KINDS:
        assert {expected for expected, check in cases if check["kind"] == kind} >= {True, False}, kind


def test_each_check_gets_its_own_outcome(graded: Any) -> None:
    cases, results, _ = graded
    assert len(results) == len(cases)
    wrong = [
        (check, result.passed, result.detail)
        for (expected, check), result in zip(cases, results, strict=True)
        if result.passed is not expected or result.kind != check["kind"] or not result.detail
    ]
    assert not wrong


def detail(graded: Any, kind: str, **params: Any) -> str:
    cases, results, _ = graded
    for (_, check), result in zip(cases, results, strict=True):
        if check["kind"] == kind and all(check.get(name) == value for name, value in params.items()):
            return str(result.detail)
    raise AssertionError(f"no case {kind} {params}")


def test_details_say_why(graded: Any) -> None:
    tables = ["./output/numbers.xlsx", "./output/amounts.csv"]
    workbooks = ["./output/11.xls", "./output/numbers.xlsx"]
    assert detail(graded, "csv_no_duplicates", path="./output/repeated.csv") == "1 duplicate row(s)"
    assert "'b': 1" in detail(graded, "csv_no_nulls", path="./output/holes.csv")
    assert "'x': 1" in detail(graded, "csv_no_iqr_outliers", path="./output/wild.csv")
    assert "amount" in detail(graded, "table_no_numeric_strings", paths=tables)
    assert "numbers.xlsx reads as Excel: 2 rows" in detail(graded, "excel_readable", paths=workbooks)
    assert detail(graded, "image_size", path="./output/wide.png") == "200x100, want 224x224"
    missing = detail(graded, "audio_louder_than_input", ref="./data/missing.wav")
    assert missing == "the reference ./data/missing.wav is missing"
    assert detail(graded, "dir_exists", path="./output/151/") == "the session did not produce the folder ./output/151/"


def test_a_corrupt_file_crashes_only_its_own_check(graded: Any) -> None:
    assert detail(graded, "image_size", path="./output/corrupt.png").startswith("check crashed: OSError: ")
    assert detail(graded, "audio_shorter_than_input", path="./output/corrupt.png").startswith("check crashed: ")
    assert detail(graded, "pickle_loads", path="./output/model.txt").startswith("pickle.load failed: ")


def test_paths_out_of_the_workspace_are_refused(graded: Any) -> None:
    assert detail(graded, "csv_rows", path="../request.json").startswith("refused path '../request.json'")
    assert detail(graded, "csv_rows", path="/etc/passwd").startswith("refused path '/etc/passwd'")
    assert detail(graded, "csv_rows", n="two").startswith("malformed check: ")
    assert workspace_name("../escaped.csv") is None and workspace_name("/etc/passwd") is None
    assert workspace_name("./output/a.csv") == "output/a.csv" and workspace_name("output/140/") == "output/140/"


def test_pickles_load_with_the_sandbox_libraries_and_without_network_or_reach(graded: Any) -> None:
    assert detail(graded, "pickle_loads", path="./output/model.pkl") == (
        "loaded a sklearn.linear_model._base.LinearRegression"
    )
    # The probe raises unless the box has loopback only and no route to this machine's Docker bridge.
    assert detail(graded, "pickle_loads", path="./output/network_probe.pkl") == "loaded a builtins.NoneType"
    # The forger's result lines reach neither the checker's output nor its own check's result.
    assert detail(graded, "pickle_loads", path="./output/forger.pkl") == "loaded a builtins.NoneType"
    assert detail(graded, "pickle_loads", path="./output/joblib_zipped.pkl", joblib=True) == (
        "loaded a sklearn.ensemble._forest.RandomForestClassifier with joblib.load"
    )
    hog = detail(graded, "pickle_loads", path="./output/memory_hog.pkl")
    assert hog.endswith("killed by signal 9 (out of memory?)")


def test_a_saved_model_must_predict_on_the_tasks_data_and_the_detail_names_what_was_loaded(graded: Any) -> None:
    flowers = "./data/flowers.csv"
    assert detail(graded, "pickle_loads", path="./output/getpid.pkl") == "loaded a builtins.int"
    refused = detail(graded, "model_predicts", path="./output/getpid.pkl")
    assert refused.startswith("refused: the pickle names posix.getpid, which is not a model library's class"), refused
    forest = detail(graded, "model_predicts", path="./output/fitted_forest.pkl", data=flowers)
    assert forest == (
        "loaded a sklearn.ensemble._forest.RandomForestClassifier: predicted 20 rows of flowers.csv from its 4 "
        "feature_names_in_ columns"
    )
    array = detail(graded, "model_predicts", path="./output/fitted_array.pkl")
    assert array.endswith("predicted 20 rows of flowers.csv from the first 2 numeric columns (n_features_in_)")
    assert detail(graded, "model_predicts", path="./output/fitted_pipeline.pkl").startswith(
        "loaded a sklearn.pipeline.Pipeline: predicted 20 rows"
    )
    unfitted = detail(graded, "model_predicts", path="./output/unfitted_forest.pkl")
    assert unfitted.startswith("loaded a sklearn.ensemble._forest.RandomForestClassifier: not a fitted model: ")
    assert "NotFittedError" in unfitted
    assert detail(graded, "model_predicts", path="./output/plain.pkl") == (
        "loaded a builtins.dict: not a fitted model: it has no predict method"
    )
    assert detail(graded, "model_predicts", data="./data/no-such.csv") == (
        "the task's input ./data/no-such.csv is missing from the grading sandbox"
    )


def test_the_suite_and_its_fixed_grading_name_only_known_kinds_with_well_formed_parameters(suite_path: Path) -> None:
    from grader.checks import runs_in_process
    from grader.variants import VARIANTS

    suite = json.loads((suite_path / "checks.json").read_text(encoding="utf-8"))
    checks = [check for task in suite for check in task["checks"]]
    checks += [check for variant in VARIANTS.values() for check in variant.fixed_checks or []]
    sandboxed = [check for check in checks if not runs_in_process(check)]
    for check, result in zip(sandboxed, file_checks.run(sandboxed, "/nonexistent"), strict=True):
        assert result["passed"] is False, (check, result)
        assert result["detail"].startswith(("the session did not produce", "the reference")), (check, result)


def test_one_call_for_every_kind_runs_in_one_grading_sandbox(graded: Any) -> None:
    """Every case of a call shares one grading sandbox (a container per check would take minutes). The time is a
    loose bound only: each pickle case starts an interpreter of its own, and the model_predicts ones import
    pandas and scikit-learn there (2 to 5 s each on two cores)."""
    cases, _, call = graded
    assert call.containers == 1, f"{call.containers} grading containers for one call"
    model_cases = sum(1 for _, check in cases if check["kind"] == "model_predicts")
    assert call.elapsed_s < 30 + 8 * model_cases, f"{call.elapsed_s:.1f} s for one call"


def test_a_check_that_never_ends_is_cut_and_its_sandbox_removed(engine: Any) -> None:
    files = {"output/slow.pkl": pickle.dumps(Reduce(time.sleep, 3600)), "output/unique.csv": b"a\n1\n"}
    checks: list[dict[str, Any]] = [
        {"kind": "csv_rows", "path": "./output/unique.csv", "n": 1},
        {"kind": "pickle_loads", "path": "./output/slow.pkl"},
    ]
    started = time.monotonic()
    results = run_file_checks(checks, files, checker=CHECKER, timeout_s=3)
    assert time.monotonic() - started < 15
    assert [(r.kind, r.passed, r.detail) for r in results] == [
        ("csv_rows", False, "grading sandbox timed out after 3 s"),
        ("pickle_loads", False, "grading sandbox timed out after 3 s"),
    ]
    assert not ours(engine)


LINGERER = """
import json, os, time
if os.fork() == 0:
    os.setsid()
    streams = []
    for pid in os.listdir("/proc"):
        try:
            streams.append(open(f"/proc/{pid}/fd/1", "w"))
        except OSError:
            pass
    time.sleep(1)  # the checker has answered by now; the streams opened above are still open
    forged = json.dumps({"results": [{"kind": "csv_rows", "passed": True, "detail": "forged"}] * 2})
    for stream in streams:
        try:
            stream.write(forged + "\\n")
            stream.flush()
        except OSError:
            pass
    os._exit(0)
"""
"""Code that leaves a process behind which, once the checker has answered, writes a forged result line into every
output it can open (the checker is not process 1 of the grading sandbox, so it cannot end what a pickle left)."""


KILLER = """
import json, os, signal
forged = json.dumps({"results": [{"kind": "csv_rows", "passed": True, "detail": "forged"}] * 2})
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/fd/1", "w") as stream:
            stream.write(forged + "\\n")
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (1, os.getpid()):
        try:
            os.kill(int(pid), signal.SIGKILL)  # the checker among them, before it answers
        except OSError:
            pass
"""
"""Code that writes a forged result line into every output it can open and then kills every other process."""


@pytest.mark.parametrize("code", [LINGERER, KILLER], ids=["lingerer", "killer"])
def test_a_result_line_forged_by_a_process_a_pickle_left_behind_fails_the_checks(engine: Any, code: str) -> None:
    files = {"output/lingerer.pkl": pickle.dumps(Reduce(exec, code)), "output/a.csv": b"a\n1\n"}
    checks: list[dict[str, Any]] = [
        {"kind": "pickle_loads", "path": "./output/lingerer.pkl"},
        {"kind": "csv_rows", "path": "./output/a.csv", "n": 5},
    ]
    results = run_file_checks(checks, files, checker=CHECKER, timeout_s=60)
    assert [r.passed for r in results] == [False, False]
    assert all(r.detail != "forged" for r in results), results
    assert not ours(engine)


def test_a_missing_image_or_engine_is_a_start_error_that_says_what_to_do(engine: Any, tmp_path: Path) -> None:
    checks = [{"kind": "dir_exists", "path": "./output"}]
    with pytest.raises(SandboxStartError, match="make images"):
        run_file_checks(checks, {}, checker=CHECKER, image="pybench-eval/no-such-image:never")
    assert not ours(engine)
    nowhere = docker.client.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41")
    with pytest.raises(SandboxStartError, match="Docker engine"):
        run_file_checks(checks, {}, checker=CHECKER, client=nowhere)
    assert run_file_checks([], {}, checker=CHECKER) == []
    # Nothing of these tests is left for the reaper (an hour's age spares whatever a live stack is grading).
    assert not {name for name in reap(client=engine, older_than_s=3600)} - {name for _, name in PREEXISTING}


def test_the_checker_runs_without_a_sandbox_on_the_standard_library(tmp_path: Path) -> None:
    (tmp_path / "output" / "140").mkdir(parents=True)
    (tmp_path / "output" / "p.pkl").write_bytes(pickle.dumps([1, 2]))
    checks: list[Any] = [
        {"kind": "dir_exists", "path": "./output/140"},
        {"kind": "pickle_loads", "path": "./output/p.pkl"},
        {"kind": "pickle_loads", "path": "./output/../../p.pkl"},
        {"kind": "image_size", "path": "./output/none.png", "width": 1, "height": 1},
        {"kind": "no_such_kind"},
        "not a check",
    ]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"checks": checks, "root": str(tmp_path)}))
    finished = subprocess.run(
        [sys.executable, "-I", file_checks.__file__, str(request)], capture_output=True, text=True, check=True
    )
    results = json.loads(finished.stdout)["results"]
    assert [r["passed"] for r in results] == [True, True, False, False, None, False]
    assert results[2]["detail"].startswith("refused path") and "did not produce" in results[3]["detail"]
    assert results == file_checks.run(checks, str(tmp_path))


def test_only_a_well_formed_result_line_is_believed() -> None:
    checks = [{"kind": "csv_rows"}, {"kind": "dir_exists"}]
    good = json.dumps({"results": [{"kind": "x", "passed": True, "detail": "ok"}, {"passed": None, "detail": "?"}]})
    results = parse_results(f"noise\n{good}\n{{not json\n".encode(), checks)
    assert results == [
        CheckResult(kind="csv_rows", passed=True, detail="ok"),
        CheckResult(kind="dir_exists", passed=None, detail="?"),
    ]
    short = json.dumps({"results": [{"kind": "x", "passed": True, "detail": "ok"}]})
    bad_type = json.dumps({"results": [{"passed": "yes", "detail": ""}, {"passed": True, "detail": ""}]})
    for garbage in (b"", b"\xff\xfe", short.encode(), bad_type.encode(), b"[1, 2]", b'{"results": 3}'):
        assert parse_results(garbage, checks) is None
    refused = parse_results(b'{"error": "bad request: KeyError"}', checks)
    assert refused is not None and all(r.passed is False and "refused the request" in r.detail for r in refused)


def test_the_checker_ends_strays_only_inside_a_grading_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its process 1 must be the grading sandbox's sleeper, and the flag and the sandbox user must be there too:
    on a host (this one) ending every other process would end the host's."""
    assert file_checks._is_sleeper(b"sleep\x003600\x00")
    for other in (b"sleep\x00infinity\x00", b"/sbin/init\x00", b"sleep\x00", b"sleep\x003600\x00x\x00", b""):
        assert not file_checks._is_sleeper(other)
    monkeypatch.setenv(file_checks.GRADING_SANDBOX_VARIABLE, "1")
    assert not file_checks._in_grading_sandbox()
