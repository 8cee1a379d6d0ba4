"""Where rows come from: a JSONL, JSON or parquet file; a directory of ``<split>`` files or
one written by ``datasets``' ``save_to_disk``; or a ``datasets`` dataset by hub id or local
directory, with a configuration name (``openai/gsm8k`` needs ``main``) and ``data_files``.
Read whole into a list (:func:`read_rows`), or streamed row by row for sets too large to
hold (:func:`open_stream`).

A split may be sliced as ``datasets`` writes it: ``train[:1000]``, ``train[100:200]``,
``train[:10%]``. Everything a user can get wrong is one line naming the config key.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from grpo_core.errors import UserError

#: our own readers, by extension, and the ``datasets`` builder that streams the same files
FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_SLICE = re.compile(r"^([\w.-]+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


@dataclass(frozen=True)
class Source:
    """One data set as the config names it; ``key`` is the config key errors name."""

    path: str
    split: str = "train"
    name: str | None = None
    data_files: Any = None
    key: str = "data.path"


def parse_split(split: str, key: str = "data.split") -> tuple[str, str | None, str | None]:
    """``train[10:20%]`` -> ("train", "10", "20%"); a bare name has no bounds."""
    m = _SLICE.match(split.strip())
    if not m:
        raise UserError(
            f"{key}: {split!r} is not a split name or a slice like train[:1000] or train[:10%]"
        )
    return m.group(1), m.group(2), m.group(3)


def _bound(text: str | None, n: int, default: int) -> int:
    if text is None:
        return default
    k = int(text.rstrip("%"))
    k = round(n * k / 100) if text.endswith("%") else k
    return max(0, min(n, k + n if k < 0 else k))


def _slice(rows: list, split: str) -> list:
    _, lo, hi = parse_split(split)
    return rows[_bound(lo, len(rows), 0) : _bound(hi, len(rows), len(rows))]


def is_saved_dataset(path: str) -> bool:
    """Whether ``path`` is a directory written by ``Dataset(Dict).save_to_disk``."""
    return os.path.isfile(os.path.join(path, "dataset_dict.json")) or (
        os.path.isfile(os.path.join(path, "state.json"))
        and os.path.isfile(os.path.join(path, "dataset_info.json"))
    )


def split_file(path: str, split: str) -> str | None:
    """``<dir>/<split>.jsonl`` (or .json, .parquet) when the directory has one."""
    for ext in FILES:
        candidate = os.path.join(path, parse_split(split)[0] + ext)
        if os.path.isfile(candidate):
            return candidate
    return None


def looks_like_hub_id(path: str) -> bool:
    """``name`` or ``org/name``: something ``datasets`` may find on the hub (or a builder
    such as ``json`` given ``data_files``), not a local path that is missing."""
    return not (
        path.count("/") > 1 or path.startswith((".", "/", "~")) or os.path.splitext(path)[1]
    )


def read_rows(
    path: str,
    split: str = "train",
    name: str | None = None,
    data_files: Any = None,
    limit: int | None = None,
    key: str = "data.path",
) -> list[dict]:
    """The rows of a data set (the first ``limit`` only, when given)."""
    src = Source(path, split, name, data_files, key)
    check_local(src)
    if os.path.isdir(path) and is_saved_dataset(path):
        ds = _saved_split(src)
        return list(ds.select(range(min(limit, len(ds)))) if limit is not None else ds)
    file = _own_file(src)
    if file is not None:
        return _slice(_read_file(file, parse_split(split)[0], key), split)[:limit]
    if os.path.isfile(path):
        raise UserError(
            f"{key}: {path} is not a .jsonl, .json or .parquet file (for another "
            f"format, name its datasets builder: data.path: csv, data.data_files: "
            f"{path})"
        )
    if not os.path.exists(path) and not looks_like_hub_id(path):
        raise UserError(f"{key}: file not found: {path}")
    datasets = _datasets(src, "reading it")
    try:
        ds = datasets.load_dataset(path, name, data_files=data_files, split=split)
    except Exception as exc:  # the hub and the builders raise many types
        raise UserError(_load_failure(src, exc)) from exc
    return list(ds.select(range(min(limit, len(ds)))) if limit is not None else ds)


def open_stream(src: Source, seed: int | None, buffer: int = 10_000) -> Any:
    """A ``datasets.IterableDataset`` over the split's rows (its slice applied; shuffled
    through a ``buffer``-row window when ``seed`` is given). ``set_epoch(e)`` gives epoch
    ``e``'s order; the same source, seed and epoch give the same rows in the same order."""
    check_local(src)
    datasets = _datasets(src, "streaming it")
    base, lo, hi = parse_split(src.split)
    if any(b is not None and (b.endswith("%") or b.startswith("-")) for b in (lo, hi)):
        raise UserError(
            f"data.split: {src.split!r}: a streamed split takes row ranges like "
            f"{base}[:1000] (no percentages or negative indices)"
        )
    file = _own_file(src)
    try:
        if os.path.isdir(src.path) and is_saved_dataset(src.path):
            ds = _saved_split(src).to_iterable_dataset()
        elif file is not None:
            ds = datasets.load_dataset(
                FILES[os.path.splitext(file)[1]], data_files=file, split="train", streaming=True
            )
        else:
            ds = datasets.load_dataset(
                src.path, src.name, data_files=src.data_files, split=base, streaming=True
            )
    except UserError:
        raise
    except Exception as exc:
        raise UserError(_load_failure(src, exc)) from exc
    start = int(lo) if lo else 0
    ds = ds.skip(start) if start else ds
    ds = ds.take(int(hi) - start) if hi is not None else ds
    return ds.shuffle(seed=seed, buffer_size=buffer) if seed is not None else ds


def check_local(src: Source) -> None:
    """Refuse, before anything opens them, a local path that is neither a regular file nor a
    directory (a FIFO or a device would block a reader or never end), and ``data_files``
    patterns that match no file (``datasets`` says only "StopIteration")."""
    if os.path.exists(src.path) and not (os.path.isfile(src.path) or os.path.isdir(src.path)):
        raise UserError(f"{src.key}: {src.path} is not a regular file or a directory")
    base = src.path if os.path.isdir(src.path) else "."
    for pattern in _patterns(src.data_files):
        if "://" in pattern or pattern.startswith("hf:"):
            continue
        full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
        matches = glob.glob(full, recursive=True)
        if not matches:
            raise UserError(
                f"data.data_files: {pattern!r} matches no file (looked in {os.path.abspath(base)})"
            )
        odd = [f for f in matches if not (os.path.isfile(f) or os.path.isdir(f))]
        if odd:
            raise UserError(f"data.data_files: {odd[0]} is not a regular file")
        if all(os.path.isdir(f) for f in matches):
            raise UserError(
                f"data.data_files: {pattern!r} matches only directories ({matches[0]}); "
                f"expected files, e.g. {os.path.join(pattern, '*.jsonl')!r}"
            )


def _patterns(data_files: Any) -> list[str]:
    """The path patterns of a ``data_files`` value (a string, a list, or {split: either})."""
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, dict):
        return [p for v in data_files.values() for p in _patterns(v)]
    if isinstance(data_files, list):
        return [p for v in data_files for p in _patterns(v)]
    return []


def _own_file(src: Source) -> str | None:
    """The file we read ourselves for ``src`` (a .jsonl/.json/.parquet path, or a directory's
    ``<split>`` file), or None when ``datasets`` reads it; a named file must exist."""
    if src.name is not None or src.data_files is not None:
        return None
    if os.path.isdir(src.path):
        file = split_file(src.path, src.split)
        if file is None and not _datasets_installed():
            raise UserError(
                f"{src.key}: directory {src.path} has no "
                f"{parse_split(src.split)[0]}.jsonl/.json/.parquet and is not a "
                f"saved dataset (other layouts need pip install datasets)"
            )
        return file
    if os.path.splitext(src.path)[1] not in FILES:
        return None
    if not os.path.isfile(src.path):
        raise UserError(f"{src.key}: file not found: {src.path}")
    return src.path


def _datasets_installed() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


def _saved_split(src: Source) -> Any:
    """The split of a directory written by ``save_to_disk`` (a Dataset, or a DatasetDict)."""
    datasets = _datasets(src, "reading it")
    if src.name is not None or src.data_files is not None:
        raise UserError(
            f"{src.key}: {src.path} was written by save_to_disk; data.name and "
            f"data.data_files do not apply to it"
        )
    try:
        ds = datasets.load_from_disk(src.path)
    except Exception as exc:
        raise UserError(
            f"{src.key}: cannot load the saved dataset {src.path} ({_one_line(exc)})"
        ) from exc
    base, lo, hi = parse_split(src.split)
    if isinstance(ds, datasets.DatasetDict):
        if base not in ds:
            raise UserError(f"data.split: {src.path} has no split {base!r} (has {sorted(ds)})")
        ds = ds[base]
    n = len(ds)
    a, b = _bound(lo, n, 0), _bound(hi, n, n)
    return ds if (a, b) == (0, n) else ds.select(range(a, max(a, b)))


def _datasets(src: Source, doing: str) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise UserError(
            f"{src.key}: {src.path} is not a file we read ourselves, and "
            f"{doing} needs the datasets package (pip install datasets)"
        ) from exc
    return datasets


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load_failure(src: Source, exc: Exception) -> str:
    what = f"dataset {src.path!r}" + (f" configuration {src.name!r}" if src.name else "")
    hint = "; set data.name" if "config name is missing" in str(exc).lower() else ""
    return f"{src.key}: cannot load {what} split {src.split!r}: {_reason(src, exc)}{hint}"


def _reason(src: Source, exc: BaseException) -> str:
    """What a ``datasets`` failure means, where it raised a library's internal exception
    (its own wrapper's cause first): what was expected, and what was found."""
    while type(exc).__name__ == "DatasetGenerationError":
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    files = f" ({', '.join(_patterns(src.data_files))})" if src.data_files else ""
    if isinstance(exc, StopIteration):
        return f"expected {src.path} rows, found none: the files{files} are empty"
    if type(exc).__module__.startswith("pyarrow"):
        return f"expected {src.path} data, found files{files} it cannot parse ({_one_line(exc)})"
    if isinstance(exc, KeyError):
        return f"expected a field or split {exc} the {src.path} builder reads, found none"
    return _one_line(exc)


def _read_file(path: str, split: str, key: str) -> list[dict]:
    if path.endswith(".jsonl"):
        return _jsonl(path, key)
    if path.endswith(".json"):
        data = _json(path, key)
        data = data.get(split, data) if isinstance(data, dict) else data
        if not isinstance(data, list):
            raise UserError(f"{key}: {path} must hold a list of objects (or {{split: list}})")
        return data
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise UserError(f"{key}: parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's errors have many types
        raise UserError(
            f"{key}: {path} is not a readable parquet file ({str(exc).splitlines()[0]})"
        ) from exc


def _jsonl(path: str, key: str) -> list[dict]:
    rows, n = [], 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                n += 1  # the line an error names
                if line.strip():
                    rows.append(json.loads(line))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}:{n + 1}: not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{n}: invalid JSON line ({exc.msg})") from exc
    except ValueError as exc:  # an integer past Python's digit limit
        raise UserError(f"{path}:{n}: {_number_problem(exc)}") from exc
    except RecursionError as exc:
        raise UserError(f"{path}:{n}: nested too deeply to be a dataset row") from exc
    except OSError as exc:
        raise UserError(f"{key}: cannot read {path} ({exc.strerror or exc})") from exc
    return rows


def _number_problem(exc: ValueError) -> str:
    """A JSON reader's ValueError in words: Python refuses integers of more than 4300
    digits (converting them costs quadratic time)."""
    if "digits" in str(exc):
        return (
            "an integer too long to read (more than 4300 digits); write it as a string "
            "if it is data"
        )
    return f"invalid JSON ({_one_line(exc)})"


def _json(path: str, key: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except ValueError as exc:  # an integer past Python's digit limit
        raise UserError(f"{path}: {_number_problem(exc)}") from exc
    except RecursionError as exc:
        raise UserError(f"{path}: nested too deeply to be a data set") from exc
    except OSError as exc:
        raise UserError(f"{key}: cannot read {path} ({exc.strerror or exc})") from exc
