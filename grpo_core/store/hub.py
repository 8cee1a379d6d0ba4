"""The final model pushed to a model hub (``output.push_to_hub``), through huggingface_hub's
public API: the repository made if missing (private unless ``output.hub_private`` is false),
then ``final/`` uploaded in one commit. The token is huggingface_hub's own (``HF_TOKEN`` or a
``hf auth login``), never a config key; ``HF_ENDPOINT`` chooses another hub."""

from __future__ import annotations

from grpo_core.config.view import OutputSection
from grpo_core.errors import UserError


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
