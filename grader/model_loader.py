"""Loads an agent's pickle, and asks the model it holds to predict: a script of its own, run by
``grader.file_checks`` in a child interpreter inside the grading sandbox (``python -I -B -u model_loader.py PATH
HOW [TABLE ROWS excel|csv]``), because unpickling runs the pickle's code.

HOW is ``pickle`` or ``joblib`` (``joblib.load`` after ``pickle.load``). It prints ``loaded a <type>``; given a
TABLE, it then predicts ROWS of it and prints ``predicted ...``, or a line saying why the object is not a
fitted model (exit code 3). A pickle that cannot be loaded raises (exit code 1). It imports only the standard
library until it needs joblib, numpy and pandas, which the sandbox image has.
"""

import pickle
import sys
from typing import Any

NOT_A_MODEL = 3
"""The exit code when the object loaded is not a fitted model (no ``predict``, or ``predict`` fails)."""


def load(path: str, how: str, want_model: bool) -> tuple[Any, str]:
    """Unpickle ``path`` (``joblib.load`` after ``pickle.load`` when ``how`` is ``joblib``: an uncompressed
    ``joblib.dump`` unpickles to its first numpy array, ``joblib.load`` gives the object). Returns the object and
    how it was loaded. Raises whatever loading raises."""
    loaded: Any = None
    unpickled = False
    try:
        with open(path, "rb") as file:
            loaded, unpickled = pickle.load(file), True
    except Exception:
        if how != "joblib":
            raise
    if how == "joblib" and (not unpickled or (want_model and not callable(getattr(loaded, "predict", None)))):
        import joblib

        try:
            candidate = joblib.load(path)
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
    path, how, data = argv[0], argv[1], argv[2:]
    loaded, suffix = load(path, how, want_model=bool(data))
    print("\nloaded a " + type(loaded).__module__ + "." + type(loaded).__qualname__ + suffix, flush=True)
    if not data:
        return 0
    try:
        print("\n" + predict(loaded, data[0], int(data[1]), data[2] == "excel"))
    except ValueError as exc:
        print(f"\n{exc}")
        return NOT_A_MODEL
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
