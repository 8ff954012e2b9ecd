"""Loads an agent's pickle, and asks the model it holds to predict: a script of its own, run by
``grader.file_checks`` in a child interpreter inside the grading sandbox (``python -I -B -u model_loader.py PATH
HOW [TABLE ROWS excel|csv]``).

HOW is ``pickle`` or ``joblib`` (``joblib.load`` after ``pickle.load``). Without a TABLE (the ``pickle_loads``
check, which keeps PyBench's reading: whatever loads passes) it unpickles as ``pickle.load`` does, running
whatever code the pickle names, and prints ``loaded a <type>``.

Given a TABLE (``model_predicts``), the verdict must be the loader's own, not something the pickle printed:

- it reads a nonce, one line on stdin, before it opens the pickle;
- it unpickles with ``RestrictedUnpickler`` (and, for joblib, ``RestrictedNumpyUnpickler``), which resolves only
  classes and reconstructors of the model libraries, so loading runs no code of the pickle's choosing; a pickle
  that names anything else (``posix.system``, ``builtins.exec``) is refused: it prints
  ``<nonce> refused: the pickle names posix.system, ...`` and exits with ``UNSAFE``;
- each verdict line starts with the nonce: ``<nonce> loaded a <type>``, then ``<nonce> predicted ...`` (exit 0)
  or ``<nonce> not a fitted model: ...`` (exit ``NOT_A_MODEL``).

A pickle that cannot be loaded raises (exit code 1). It imports only the standard library until it needs joblib,
numpy and pandas, which the sandbox image has.
"""

import _compat_pickle
import functools
import pickle
import sys
from typing import Any

NOT_A_MODEL = 3
"""The exit code when the object loaded is not a fitted model (no ``predict``, or ``predict`` fails)."""

UNSAFE = 4
"""The exit code when the pickle names something other than a model library's class or reconstructor."""

MODEL_LIBRARIES = ("sklearn", "numpy", "scipy", "pandas", "xgboost", "lightgbm")
"""The packages whose classes a model's pickle may name (any class defined in them, bar ``REFUSED_PARTS``)."""

REFUSED_PARTS = (
    "numpy.f2py",
    "numpy.distutils",
    "numpy.testing",
    "numpy.ctypeslib",
    "numpy.memmap",
    "numpy.DataSource",
    "numpy.core.memmap",
    "numpy._core.memmap",
    "numpy.lib._datasource",
    "numpy.lib.npyio",
    "numpy.lib._npyio_impl",
    "numpy.lib.stride_tricks",
    "numpy.lib._stride_tricks_impl",
    "pandas.io",
    "pandas.core.computation",
    "pandas.util",
    "pandas.testing",
    "pandas._testing",
    "pandas.plotting",
    "scipy.io",
    "scipy._lib",
    "sklearn.datasets",
    "sklearn.externals",
    "sklearn.utils._testing",
    "xgboost.testing",
)
"""Modules and classes of the model libraries that a model never needs and that read or write files, map raw
memory or evaluate expressions (``numpy.memmap``, ``pandas.io``, pandas' ``eval`` machinery): refused, with
everything under them."""

SAFE_GLOBALS = frozenset(
    [f"builtins.{name}" for name in ("object", "list", "dict", "set", "frozenset", "tuple", "slice", "range")]
    + [f"builtins.{name}" for name in ("complex", "bytearray", "bytes", "str", "int", "float", "bool")]
    + [f"collections.{name}" for name in ("OrderedDict", "defaultdict", "deque", "Counter")]
    + [f"datetime.{name}" for name in ("datetime", "date", "time", "timedelta", "timezone")]
    + ["copyreg._reconstructor"]
)
"""Names outside the model libraries that a pickle may use: plain containers and values, and ``copyreg``'s
reconstructor (which only calls classes the pickle got through these rules)."""

RECONSTRUCTORS = frozenset(
    [f"numpy.{core}.multiarray.{name}" for core in ("core", "_core") for name in ("_reconstruct", "scalar")]
    + [f"numpy.{core}.numeric._frombuffer" for core in ("core", "_core")]
    + ["numpy.ma.core._mareconstruct"]
    + [f"numpy.random._pickle.__{name}_ctor" for name in ("randomstate", "generator", "bit_generator")]
    + [
        "pandas._libs.internals._unpickle_block",
        "pandas.core.indexes.base._new_Index",
        "pandas.core.indexes.datetimes._new_DatetimeIndex",
        "pandas.core.indexes.period._new_PeriodIndex",
        "pandas._libs.tslibs.timestamps._unpickle_timestamp",
        "pandas._libs.tslibs.timedeltas._timedelta_unpickle",
        "pandas._libs.tslibs.nattype.__nat_unpickle",
    ]
)
"""The functions of the model libraries that pickles of their objects call to rebuild them (numpy arrays,
scalars and random states, pandas frames and indexes). Also allowed: Cython's ``__pyx_unpickle_<Class>`` and
scikit-learn's ``newObj`` (both only make an instance of a class the pickle got through these rules), and numpy
ufuncs (``numpy.log1p``, as a ``FunctionTransformer`` holds it)."""


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names something that is not a model library's class or reconstructor."""


def _refuse(module: str, name: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"the pickle names {module}.{name}, which is not a model library's class "
        f"(only classes and reconstructors of {', '.join(MODEL_LIBRARIES)} and plain containers load)"
    )


def _under(dotted: str, prefixes: tuple[str, ...]) -> bool:
    return any(dotted == prefix or dotted.startswith(prefix + ".") for prefix in prefixes)


def _latin1_encode(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as protocol-2 pickles of ``bytes`` use it (``encode(text, 'latin1')``), that codec only."""
    if encoding != "latin1" or not isinstance(text, str):
        raise UnsafePickleError(f"the pickle calls _codecs.encode with {encoding!r}: only latin1 builds bytes")
    return text.encode("latin1")


def resolve_global(module: str, name: str, find: Any) -> Any:
    """What ``module.name`` of a pickle may resolve to: ``find(module, name)`` (the unpickler's own lookup,
    which imports ``module``) when the rules of this module allow it.

    Raises:
        UnsafePickleError: ``module.name`` is not a class of ``MODEL_LIBRARIES`` (outside ``REFUSED_PARTS``), a
            listed reconstructor, a numpy ufunc or one of ``SAFE_GLOBALS``. A module outside the model
            libraries, or under ``REFUSED_PARTS``, is refused before it is imported.
        ImportError, AttributeError: an allowed module or name that does not exist here.
    """
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    dotted = f"{module}.{name}"
    if dotted in SAFE_GLOBALS:
        return find(module, name)
    if dotted == "_codecs.encode":
        return _latin1_encode
    if dotted in ("joblib.numpy_pickle.NumpyArrayWrapper", "sklearn.externals.joblib.numpy_pickle.NumpyArrayWrapper"):
        return _restricted_array_wrapper()
    if dotted in ("numpy.core._ufunc_reconstruct", "numpy._core._ufunc_reconstruct"):
        return lambda module, name: _ufunc(module, name, find)
    real = _real_name(module)
    if (
        not name.isidentifier()
        or not _under(real, MODEL_LIBRARIES)
        or _under(real, REFUSED_PARTS)
        or _under(f"{real}.{name}", REFUSED_PARTS)
        or any(part.startswith("__") or part in ("tests", "testing", "conftest") for part in real.split("."))
    ):
        raise _refuse(module, name)
    reconstructor = (
        f"{real}.{name}" in RECONSTRUCTORS
        or name.startswith("__pyx_unpickle_")
        or (name == "newObj" and _under(real, ("sklearn",)))
    )
    if name.startswith("__") and not reconstructor:
        raise _refuse(module, name)
    found = find(module, name)
    if isinstance(found, type):
        lineage = [f"{_real_name(cls.__module__)}.{cls.__qualname__}" for cls in found.__mro__ if cls is not object]
        if _under(_real_name(found.__module__), MODEL_LIBRARIES) and not any(_under(c, REFUSED_PARTS) for c in lineage):
            return found
    elif (reconstructor and callable(found)) or _is_ufunc(found):
        return found
    raise _refuse(module, name)


def _real_name(module: str) -> str:
    """The name ``module`` was imported as: a Cython module also registers under its short name (sklearn's
    ``_loss`` is ``sklearn._loss._loss``), and is judged by its real one."""
    return str(getattr(sys.modules.get(module), "__name__", module))


def _is_ufunc(value: Any) -> bool:
    return type(value).__name__ == "ufunc" and type(value).__module__ == "numpy"


def _ufunc(module: str, name: str, find: Any) -> Any:
    """numpy's old ``_ufunc_reconstruct``, restricted: the ufunc ``module.name``, through the same rules."""
    found = resolve_global(module, name, find)
    if not _is_ufunc(found):
        raise _refuse(module, name)
    return found


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves globals through ``resolve_global``: loading builds objects of the
    model libraries and plain containers, and calls nothing else.

    ``load`` raises ``UnsafePickleError`` for a global it refuses, and whatever ``pickle.load`` raises otherwise.
    """

    def find_class(self, module: str, name: str) -> Any:
        return resolve_global(module, name, super().find_class)


@functools.cache
def _restricted_array_wrapper() -> type:
    """joblib's ``NumpyArrayWrapper`` (the marker of an array whose bytes follow in the file), except that an array
    of objects, which joblib reads with a plain ``pickle.load`` of what follows, is read with a
    ``RestrictedUnpickler``. Raises ImportError without joblib."""
    from joblib.numpy_pickle import NumpyArrayWrapper

    class ArrayWrapper(NumpyArrayWrapper):  # type: ignore[misc]
        def read_array(self, unpickler: Any) -> Any:
            if not self.dtype.hasobject:
                return super().read_array(unpickler)
            array = RestrictedUnpickler(unpickler.file_handle).load()
            if not isinstance(array, unpickler.np.ndarray):
                raise pickle.UnpicklingError(f"an array of objects unpickled to a {type(array).__name__}")
            return array

    return ArrayWrapper


def _restricted_joblib_load(path: str) -> Any:
    """``joblib.load(path)`` with the rules of ``resolve_global``: the same decompression and array reading
    (``joblib.numpy_pickle.load``, no memory mapping), with an unpickler whose ``find_class`` is restricted.

    Raises:
        UnsafePickleError: a refused global, or a file of joblib < 0.10's format (its arrays are separate
            ``numpy.load`` files that may hold pickles).
        ImportError: joblib is missing. Otherwise whatever ``joblib.load`` raises.
    """
    from joblib.numpy_pickle import NumpyUnpickler
    from joblib.numpy_pickle_utils import _read_fileobject

    class RestrictedNumpyUnpickler(NumpyUnpickler):  # type: ignore[misc]
        def find_class(self, module: str, name: str) -> Any:
            return resolve_global(module, name, super().find_class)

    with open(path, "rb") as raw, _read_fileobject(raw, path, None) as file:
        if isinstance(file, str):
            raise UnsafePickleError("the file has joblib < 0.10's format, whose arrays may be pickles of their own")
        return RestrictedNumpyUnpickler(path, file).load()


def unpickle(path: str, restricted: bool) -> Any:
    """``pickle.load`` of ``path``; with ``restricted``, through a ``RestrictedUnpickler``.

    Raises:
        UnsafePickleError: ``restricted`` and the pickle names a global the rules refuse.
        Otherwise whatever ``pickle.load`` raises (UnpicklingError, ImportError, EOFError...).
    """
    with open(path, "rb") as file:
        return RestrictedUnpickler(file).load() if restricted else pickle.load(file)


def joblib_load(path: str, restricted: bool) -> Any:
    """``joblib.load`` of ``path``; with ``restricted``, under the same rules as ``unpickle``.

    Raises:
        UnsafePickleError: as ``unpickle``, or an old joblib format (see ``_restricted_joblib_load``).
        ImportError: joblib is missing. Otherwise whatever ``joblib.load`` raises.
    """
    if restricted:
        return _restricted_joblib_load(path)
    import joblib

    return joblib.load(path)


def load(path: str, how: str, want_model: bool, restricted: bool = False) -> tuple[Any, str]:
    """Unpickle ``path`` (``joblib.load`` after ``pickle.load`` when ``how`` is ``joblib``: an uncompressed
    ``joblib.dump`` unpickles to its first numpy array, ``joblib.load`` gives the object), with the restricted
    unpicklers when ``restricted``. Returns the object and how it was loaded.

    Raises:
        UnsafePickleError: ``restricted`` and the pickle (or, with joblib, the joblib file) names a refused
            global. Otherwise whatever loading raises.
    """
    loaded: Any = None
    unpickled = False
    try:
        loaded, unpickled = unpickle(path, restricted), True
    except Exception:
        # A joblib file's raw array bytes, read as pickle opcodes, may name a refused global: joblib decides.
        if how != "joblib":
            raise
    if how == "joblib" and (not unpickled or (want_model and not callable(getattr(loaded, "predict", None)))):
        try:
            candidate = joblib_load(path, restricted)
        except UnsafePickleError:
            raise
        except Exception:
            if not unpickled:
                raise
        else:
            if not unpickled or callable(getattr(candidate, "predict", None)):
                return candidate, " with joblib.load"
    return loaded, ""


def features_of(model: Any, frame: Any) -> tuple[Any, str, bool]:
    """The columns of ``frame`` the model was fitted on, as a fitted scikit-learn estimator tells: its
    ``feature_names_in_`` (a frame; absent columns as zeros), else its first ``n_features_in_`` numeric columns
    (zeros where fewer), else every numeric column. Returns them, what they are, and whether by name."""
    names = getattr(model, "feature_names_in_", None)
    count = getattr(model, "n_features_in_", None)
    if names is not None:
        names = [str(name) for name in names]
        missing = [name for name in names if name not in frame.columns]
        features = frame.reindex(columns=names)
        features[missing] = 0
        source = f"its {len(names)} feature_names_in_ columns"
        source += f" ({len(missing)} not in the data, as zeros: {missing[:3]})" if missing else ""
        return features, source, True
    if isinstance(count, int) and not isinstance(count, bool):
        numeric = frame.select_dtypes("number").iloc[:, :count]
        features = numeric.copy()
        for pad in range(count - numeric.shape[1]):
            features[f"zeros {pad}"] = 0
        source = f"the first {count} numeric columns (n_features_in_)"
        if numeric.shape[1] < count:
            source += f", {count - numeric.shape[1]} of them zeros: the data has only {numeric.shape[1]}"
        return features, source, False
    features = frame.select_dtypes("number")
    return features, f"the {features.shape[1]} numeric columns (it names no features: fitted?)", False


def predict(model: Any, table: str, rows_wanted: int, excel: bool) -> str:
    """Ask ``model`` to predict ``rows_wanted`` rows of ``table`` (rows without a missing value first). Returns
    what it predicted on. Raises ValueError (the message says why) when it is not a fitted model."""
    if not callable(getattr(model, "predict", None)):
        raise ValueError("not a fitted model: it has no predict method")
    import pandas as pd

    frame = pd.read_excel(table) if excel else pd.read_csv(table)
    features, source, by_name = features_of(model, frame)
    rows = features.dropna().head(rows_wanted)
    if rows.empty:
        rows = features.head(rows_wanted)
    try:
        length = len(model.predict(rows if by_name else rows.to_numpy()))
    except Exception as exc:
        raise ValueError(f"not a fitted model: predict on {source} raised {type(exc).__name__}: {exc}") from exc
    if length != len(rows):
        raise ValueError(f"not a fitted model: predict gave {length} answers for {len(rows)} rows")
    return f"predicted {len(rows)} rows of {table.rsplit('/', 1)[-1]} from {source}"


def main(argv: list[str]) -> int:
    """Load (and, given a table, predict); print the verdict lines. Returns the exit code: 0, ``NOT_A_MODEL`` or
    ``UNSAFE``. Raises whatever loading raises (exit code 1). Given a table, it first reads the nonce from stdin."""
    path, how, data = argv[0], argv[1], argv[2:]
    if not data:
        loaded, suffix = load(path, how, want_model=False)
        print("\nloaded a " + type(loaded).__module__ + "." + type(loaded).__qualname__ + suffix, flush=True)
        return 0
    nonce = sys.stdin.readline().strip()
    if not nonce:
        raise SystemExit("model_loader: predicting needs the grader's nonce, one line on stdin")

    def say(line: str) -> None:
        print(f"\n{nonce} {line}", flush=True)

    try:
        loaded, suffix = load(path, how, want_model=True, restricted=True)
    except UnsafePickleError as exc:
        say(f"refused: {exc}")
        return UNSAFE
    say("loaded a " + type(loaded).__module__ + "." + type(loaded).__qualname__ + suffix)
    try:
        say(predict(loaded, data[0], int(data[1]), data[2] == "excel"))
    except ValueError as exc:
        say(str(exc))
        return NOT_A_MODEL
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
