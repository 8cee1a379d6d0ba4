"""GGUF files as a model source (``model.gguf_file``).

transformers reads a GGUF file by dequantizing every tensor to float, which takes seconds to
minutes and happens on each load; the model it returns also refuses ``save_pretrained``. So a
GGUF file is converted once into an ordinary safetensors model directory (weights in
float32, config without the quantization entry, the tokenizer and chat template read from
the same file) under a cache keyed by the file's path, size and modification time, and every
later load (the policy, the tokenizer, ``grpo eval``, a resumed run) reads that directory.
Training is therefore in float, never in the quantized format.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch

from grpo_core.config.view import ModelSection
from grpo_core.errors import UserError

#: bump when the converted directory's layout changes, so older caches are not reused
FORMAT = 1


def cache_root() -> str:
    """Where converted models live: ``$GRPO_CORE_CACHE``, else ``$XDG_CACHE_HOME/grpo_core``,
    else ``~/.cache/grpo_core``."""
    if os.environ.get("GRPO_CORE_CACHE"):
        return os.environ["GRPO_CORE_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "grpo_core")


def cache_problem() -> str | None:
    """Why converted models cannot be kept under :func:`cache_root` (None when they can): a
    part of its path that exists but is not a directory (the folder itself is made when
    missing)."""
    root = cache_root()
    named = next(
        (v for v in ("GRPO_CORE_CACHE", "XDG_CACHE_HOME") if os.environ.get(v)), "the cache"
    )
    path = os.path.abspath(root)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.isdir(path):
        return None
    found = "a file" if path == os.path.abspath(root) else f"inside {path}, a file"
    return (
        f"{named}: {root} is {found} (expected a directory for the converted GGUF models, "
        f"made if missing)"
    )


def gguf_path(model: ModelSection) -> str | None:
    """The GGUF file the config names (None when it names none): ``gguf_file`` inside
    ``name_or_path`` when that directory holds it, else ``gguf_file`` as a path."""
    name = model.gguf_file
    if not name:
        return None
    inside = os.path.join(model.name_or_path, name)
    return inside if os.path.isfile(inside) or not os.path.isfile(name) else name


def model_dir(model: ModelSection) -> str:
    """The directory (or hub id) transformers loads the model and tokenizer from: the
    converted cache of ``model.gguf_file`` when one is set (converting it now if needed),
    else ``model.name_or_path``."""
    path = gguf_path(model)
    if path is None:
        return model.name_or_path
    if not os.path.isfile(path):
        raise UserError(
            f"model.gguf_file: {path} not found (expected a .gguf file, by name "
            f"inside model.name_or_path or as a path)"
        )
    problem = cache_problem()
    if problem:
        raise UserError(problem)
    out = os.path.join(cache_root(), "gguf", cache_key(path))
    if not os.path.isfile(os.path.join(out, "config.json")):
        print(
            f"note: converting {path} to float weights once, into {out}",
            file=sys.stderr,
            flush=True,
        )
        convert(path, out)
    return out


def cache_key(path: str) -> str:
    """A name for the file's conversion: its real path, size and modification time (a file
    rewritten in place gets a new key), and the converter's format."""
    st = os.stat(path)
    ident = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{FORMAT}"
    stem = os.path.splitext(os.path.basename(path))[0]
    return f"{stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def convert(path: str, out: str) -> None:
    """Dequantize the GGUF file at ``path`` into a safetensors model directory ``out``,
    written in a temporary directory beside it and renamed into place (a crash leaves no
    half-written model; of two processes converting at once, the first rename wins)."""
    model, tokenizer = _read(path)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        st = os.stat(path)
        with open(os.path.join(tmp, "gguf_source.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "file": os.path.realpath(path),
                    "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "format": FORMAT,
                },
                f,
                indent=2,
            )
        try:
            os.rename(tmp, out)
        except OSError:  # another process renamed its conversion first
            if not os.path.isfile(os.path.join(out, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read(path: str):
    """The GGUF file's model, rebuilt as a plain float32 model (no quantization config, so
    it saves), and its tokenizer."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise UserError(
            "model.gguf_file: reading GGUF needs the gguf and accelerate packages "
            "(pip install 'grpo-core[gguf]')"
        ) from exc
    hf_logging.disable_progress_bar()
    folder, name = os.path.split(os.path.abspath(path))
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # a truncated file, an unknown architecture or tensor type
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"model.gguf_file: cannot load {path} as a GGUF model: {first}") from exc
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer
