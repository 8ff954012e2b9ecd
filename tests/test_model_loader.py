"""``model_predicts`` judges what the grader observes, not what an agent's pickle prints.

A pickle runs code when it is unpickled: one could print ``loaded a ...`` and ``predicted ...`` itself and exit
0. The loader (``grader/model_loader.py``) unpickles with a restricted unpickler that resolves only classes and
reconstructors of the model libraries, and only its lines that carry the grader's fresh nonce count. The host
tests run the loader with this machine's Python (the standard library is all a refusal needs); the ``docker``
ones grade real scikit-learn models, and hostile pickles that need numpy, in a grading sandbox of the sandbox
image. Nothing here opens a connection: the sandboxes have no network.
"""

import builtins
import collections
import io
import json
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from grader import file_checks, model_loader
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE
from services.sandbox.grading_docker import run_file_checks
from tests.servers import files_made_in_sandbox_image

REFUSED = "which is not a model library's class"
"""What every refusal says after the name it refused."""


class Reduce:
    """Pickles as a call of ``function(*args)``: what a hostile pickle runs when it is loaded."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


def forger(marker: Path) -> str:
    """Code that leaves a mark, prints the lines a passing model prints, and exits 0 before the loader can."""
    return (
        f"open({str(marker)!r}, 'w').close()\n"
        "print('\\nloaded a sklearn.linear_model._base.LinearRegression', flush=True)\n"
        "print('\\npredicted 20 rows of table.csv from x', flush=True)\n"
        "import os; os._exit(0)\n"
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A session's workspace: the task's table under ``data/``, the pickles go under ``output/``."""
    (tmp_path / "data").mkdir()
    (tmp_path / "output").mkdir()
    (tmp_path / "data" / "table.csv").write_text("x,y\n" + "".join(f"{i},{2 * i}\n" for i in range(30)))
    return tmp_path


def hostile_pickles(marker: Path) -> dict[str, tuple[bytes, str]]:
    """Pickles whose loading would run a command, by name: their bytes and the global the loader must refuse."""
    command = f"touch {marker}; echo loaded a LinearRegression; echo predicted 20 rows"
    return {
        "system": (pickle.dumps(Reduce(os.system, command)), "posix.system"),
        "exec": (pickle.dumps(Reduce(builtins.exec, forger(marker))), "builtins.exec"),
        "exec_protocol_0": (pickle.dumps(Reduce(builtins.exec, forger(marker)), protocol=0), "builtins.exec"),
        "exec_in_a_dict": (pickle.dumps({"model": [Reduce(builtins.exec, forger(marker))]}), "builtins.exec"),
        "popen": (pickle.dumps(Reduce(subprocess.Popen, ["touch", str(marker)])), "subprocess.Popen"),
        "getpid": (pickle.dumps(Reduce(os.getpid)), "posix.getpid"),
    }


@pytest.mark.parametrize("name", sorted(hostile_pickles(Path("m"))))
def test_a_pickle_that_names_code_is_refused_and_its_code_never_runs(workspace: Path, name: str) -> None:
    marker = workspace / "ran"
    data, named = hostile_pickles(marker)[name]
    (workspace / "output" / "model.pkl").write_bytes(data)
    check = {"kind": "model_predicts", "path": "./output/model.pkl", "data": "./data/table.csv"}
    passed, detail = file_checks.model_predicts(check, workspace)
    assert not passed
    assert detail.startswith(f"refused: the pickle names {named}, {REFUSED}"), detail
    assert not marker.exists(), "the pickle's code ran"


def run_loader(path: Path, table: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    """The loader as ``model_predicts`` runs it: a child interpreter, isolated, given ``stdin``."""
    return subprocess.run(
        [sys.executable, "-I", "-B", "-u", str(file_checks.MODEL_LOADER), str(path), "pickle", str(table), "20", "csv"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_loaders_verdict_lines_carry_the_nonce_it_was_given_and_it_wants_one(workspace: Path) -> None:
    model = workspace / "output" / "model.pkl"
    model.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))
    nonce = secrets.token_hex(16)
    finished = run_loader(model, workspace / "data" / "table.csv", f"{nonce}\n")
    assert finished.returncode == model_loader.NOT_A_MODEL, finished.stderr
    assert [line for line in finished.stdout.splitlines() if line] == [
        f"{nonce} loaded a builtins.dict",
        f"{nonce} not a fitted model: it has no predict method",
    ]
    without = run_loader(model, workspace / "data" / "table.csv", "")
    assert without.returncode == 1 and "needs the grader's nonce" in without.stderr
    assert "loaded a" not in without.stdout


def test_the_rules_let_containers_through_and_refuse_what_is_not_a_model_library_before_importing_it() -> None:
    value = collections.OrderedDict(
        a=[1, 2.5, "s", b"b", None, True, {3}, frozenset({4}), (5,), slice(1, 2), complex(1, 2), range(3)],
        b=collections.defaultdict(list, {"k": [bytearray(b"x")]}),
    )
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert model_loader.RestrictedUnpickler(io.BytesIO(pickle.dumps(value, protocol=protocol))).load() == value
    refused = {
        b"cbuiltins\ngetattr\n.": "builtins.getattr",
        b"c__builtin__\neval\n.": "builtins.eval",  # protocol 2's name for builtins is mapped first
        b"cfunctools\npartial\n.": "functools.partial",
        b"cnot_a_module_anywhere\nthing\n.": "not_a_module_anywhere.thing",  # refused, not imported
        b"csklearn\n__builtins__\n.": "sklearn.__builtins__",
        b"cnumpy.f2py.__main__\nmain\n.": "numpy.f2py.__main__.main",
        b"c_codecs\nlookup\n.": "_codecs.lookup",
    }
    for data, named in refused.items():
        with pytest.raises(model_loader.UnsafePickleError, match=f"^the pickle names {named}, {REFUSED}"):
            model_loader.RestrictedUnpickler(io.BytesIO(data)).load()
    assert "not_a_module_anywhere" not in sys.modules


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(0.5)
    open({marker!r}, "w").close()
    os._exit(0)
"""
"""Code that leaves a process behind, which acts half a second after the loader that ran it has ended."""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_process_a_pickle_leaves_behind_is_killed_when_its_check_ends(workspace: Path) -> None:
    """``pickle_loads`` runs a pickle's code; what it leaves running must be gone before the next check (it could
    read a later loader's nonce). The checker is process 1 in the grading sandbox: here, of a PID namespace."""
    marker = workspace / "ran"
    (workspace / "output" / "daemon.pkl").write_bytes(
        pickle.dumps(Reduce(builtins.exec, DAEMON.format(marker=str(marker))))
    )
    (workspace / "output" / "slow.pkl").write_bytes(pickle.dumps(Reduce(time.sleep, 1.5)))
    checks = [
        {"kind": "pickle_loads", "path": "./output/daemon.pkl"},
        {"kind": "pickle_loads", "path": "./output/slow.pkl"},
    ]
    request = workspace / "request.json"
    request.write_text(json.dumps({"checks": checks, "root": str(workspace)}))
    finished = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-I", file_checks.__file__, str(request)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    results = json.loads(finished.stdout)["results"]
    assert [r["passed"] for r in results] == [True, True], results
    assert not marker.exists(), "a process the pickle started outlived its check"


# -- in the sandbox image (scikit-learn, numpy, joblib) -------------------------------------------------------

MODELS = r"""
import base64, io, os, pickle, sys, tarfile
import joblib
import numpy as np
import pandas as pd
from sklearn.compose import make_column_transformer
from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestClassifier
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder

rng = np.random.default_rng(0)
frame = pd.DataFrame({"a": rng.normal(size=60), "b": rng.normal(size=60), "colour": rng.choice(["red", "blue"], 60)})
species = rng.choice(["setosa", "virginica"], 60)  # string labels: classes_ is an array of objects
out = {"data/table.csv": frame.to_csv(index=False).encode()}
def keep(name, write):
    buffer = io.BytesIO(); write(buffer); out["output/" + name] = buffer.getvalue()

forest = RandomForestClassifier(n_estimators=5, random_state=0).fit(frame[["a", "b"]], species)
keep("forest.pkl", lambda b: pickle.dump(forest, b))
keep("forest_joblib.pkl", lambda b: joblib.dump(forest, b))
keep("forest_zipped.pkl", lambda b: joblib.dump(forest, b, compress=3))
encode = make_column_transformer((OneHotEncoder(handle_unknown="ignore"), ["colour"]), remainder="passthrough")
pipeline = make_pipeline(encode, RandomForestClassifier(n_estimators=5, random_state=0)).fit(frame, species)
keep("pipeline_joblib.pkl", lambda b: joblib.dump(pipeline, b))
boosted = HistGradientBoostingRegressor(max_iter=5).fit(frame[["a", "b"]].to_numpy(), rng.normal(size=60))
keep("boosted.pkl", lambda b: pickle.dump(boosted, b, protocol=5))
absolute = make_pipeline(FunctionTransformer(np.abs), Ridge()).fit(frame[["a", "b"]], rng.normal(size=60))
keep("ufunc.pkl", lambda b: pickle.dump(absolute, b, protocol=2))  # names the ufunc numpy.absolute

class Command:
    def __reduce__(self):
        return os.system, ("echo loaded a X; echo predicted 20 rows",)

# joblib reads an array of objects with a plain pickle.load of the bytes that follow: a place to hide a command.
keep("hidden_in_array.pkl", lambda b: joblib.dump({"coef_": np.array([1, Command()], dtype=object)}, b))

archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w") as tar:
    for name, data in out.items():
        info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
sys.stdout.write(base64.b64encode(archive.getvalue()).decode())
"""
"""Makes genuine scikit-learn models (pickled, and saved with joblib.dump plainly and compressed) and a joblib
file with a command hidden in an array of objects, in the sandbox image; prints them as one base64 tar line."""

TABLE = {"data": "./data/table.csv"}


@pytest.mark.docker
def test_in_a_grading_sandbox_real_models_predict_and_what_names_code_or_files_is_refused() -> None:
    engine = docker.from_env()
    if not engine.images.list(name=DEFAULT_SANDBOX_IMAGE):
        pytest.fail(f"the sandbox image {DEFAULT_SANDBOX_IMAGE} is missing: build it with `make images`")
    files = files_made_in_sandbox_image(engine, DEFAULT_SANDBOX_IMAGE, MODELS)
    files["output/memmap.pkl"] = b"cnumpy\nmemmap\n(S'/workspace/output/forest.pkl'\nS'r+'\ntR."
    files["output/pandas_eval.pkl"] = b"cpandas\neval\n(S'1 + 1'\ntR."
    files["output/forger.pkl"] = pickle.dumps(Reduce(builtins.exec, forger(Path("/tmp/ran"))))
    forest = "loaded a sklearn.ensemble._forest.RandomForestClassifier"
    predicted = "predicted 20 rows of table.csv from"
    expected = {
        ("forest.pkl", False): (True, f"{forest}: {predicted} its 2 feature_names_in_ columns"),
        ("forest_joblib.pkl", True): (True, f"{forest} with joblib.load: {predicted} its 2 feature_names_in_ columns"),
        ("forest_zipped.pkl", True): (True, f"{forest} with joblib.load: {predicted} its 2 feature_names_in_ columns"),
        ("pipeline_joblib.pkl", True): (
            True,
            f"loaded a sklearn.pipeline.Pipeline with joblib.load: {predicted} its 3 feature_names_in_ columns",
        ),
        ("boosted.pkl", False): (
            True,
            "loaded a sklearn.ensemble._hist_gradient_boosting.gradient_boosting.HistGradientBoostingRegressor: "
            f"{predicted} the first 2 numeric columns (n_features_in_)",
        ),
        ("ufunc.pkl", False): (
            True,
            f"loaded a sklearn.pipeline.Pipeline: {predicted} its 2 feature_names_in_ columns",
        ),
        ("hidden_in_array.pkl", True): (False, f"refused: the pickle names posix.system, {REFUSED}"),
        ("memmap.pkl", False): (False, f"refused: the pickle names numpy.memmap, {REFUSED}"),
        ("pandas_eval.pkl", False): (False, f"refused: the pickle names pandas.eval, {REFUSED}"),
        ("forger.pkl", True): (False, f"refused: the pickle names builtins.exec, {REFUSED}"),
    }
    checks = [
        {"kind": "model_predicts", "path": f"./output/{name}", **TABLE, "joblib": joblib} for name, joblib in expected
    ]
    results = run_file_checks(checks, files, checker=file_checks.checker_sources(), timeout_s=300)
    got = {
        (c["path"].rsplit("/", 1)[-1], c["joblib"]): (r.passed, r.detail) for c, r in zip(checks, results, strict=True)
    }
    for case, (passed, detail) in expected.items():
        assert got[case][0] is passed, (case, got[case])
        assert got[case][1].startswith(detail), (case, got[case])
