"""The final model pushed to a model hub (``output.push_to_hub``), through huggingface_hub's
public API: the repository made if missing (private unless ``output.hub_private`` is false),
then ``final/`` uploaded in one commit. The token is huggingface_hub's own (``HF_TOKEN`` or a
``hf auth login``), never a config key; ``HF_ENDPOINT`` chooses another hub. Every request
has a time limit (huggingface_hub sets none): a hub that accepts the connection but never
answers ends the push with the usual one line instead of holding the run forever."""

from __future__ import annotations

import os

from grpo_core.config.view import OutputSection
from grpo_core.errors import UserError

#: seconds one request may wait to connect, or for the hub's next bytes (not the whole upload)
TIMEOUT = 120.0
TIMEOUT_ENV = "GRPO_CORE_HUB_TIMEOUT"  # another limit, in seconds (a slow proxy; the tests)


def problems(output: OutputSection) -> list[str]:
    """Settings that cannot push (one line each), found before a model loads."""
    if not output.push_to_hub:
        return []
    found = []
    if not output.hub_model_id:
        found.append("output.hub_model_id: needed with output.push_to_hub (user/name)")
    if not output.save_model:
        found.append("output.push_to_hub: needs output.save_model: true (it pushes final/)")
    return found


def push(folder: str, repo_id: str, private: bool, message: str) -> str:
    """Upload ``folder`` to the model repository ``repo_id`` (made if missing); returns the
    commit's URL. A failure is one line saying where the model still is and how to push it
    by hand."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import get_session

    get_session().timeout = _timeout()  # the client huggingface_hub shares between its calls
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message=message)
    except Exception as exc:  # HTTP, connection and authentication errors alike
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"output.push_to_hub: uploading {folder} to {repo_id} failed ({first}); the model "
            f"is saved there: push it with `hf upload {repo_id} {folder}`"
        ) from exc
    return commit.commit_url


def _timeout() -> float:
    """The per-request limit: TIMEOUT, or a positive number of seconds in TIMEOUT_ENV."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else TIMEOUT
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"{TIMEOUT_ENV}: found {raw!r}, expected a positive number of seconds")
    return value
