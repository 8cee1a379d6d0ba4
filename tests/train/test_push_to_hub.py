"""output.push_to_hub: a real run uploads final/ through huggingface_hub to a hub on
127.0.0.1 (HF_ENDPOINT), byte for byte; a hub that cannot be reached is one line naming the
setting, with the model kept; a missing repository id is refused before a model loads."""

from __future__ import annotations

import json
import os
import socket

import pytest
from fake_hub import FakeHub
from helpers import make_config, run_grpo, write_config

from grpo_core import config, preflight
from grpo_core.errors import ConfigError

HUB = {"push_to_hub": True, "hub_model_id": "someone/tiny-grpo", "progress": False}


def _config(tiny_model, addition_data, tmp_path, **output) -> tuple[str, str]:
    out = str(tmp_path / "run")
    cfg = make_config(
        tiny_model, addition_data, out, train={"steps": 1}, output={"dir": out, **output}
    )
    return write_config(tmp_path / "c.json", cfg), out


def test_the_final_model_reaches_the_hub(tiny_model, addition_data, tmp_path):
    hub = FakeHub()
    try:
        path, out = _config(tiny_model, addition_data, tmp_path, **HUB)
        p = run_grpo("train", path, env={"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test"})
        assert p.returncode == 0, p.stderr[-2000:]
    finally:
        hub.close()
    assert hub.created == [
        {"name": "tiny-grpo", "organization": "someone", "visibility": "private"}
    ]
    final = os.path.join(out, "final")
    sent = {name: data for (repo, name), data in hub.files.items() if repo == "someone/tiny-grpo"}
    assert sorted(sent) == sorted(os.listdir(final))
    for name, data in sent.items():
        with open(os.path.join(final, name), "rb") as f:
            assert f.read() == data, name
    assert all(auth == "Bearer hf_test" for method, _, auth in hub.calls if method == "POST")
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["hub_commit"] == f"{hub.url}/someone/tiny-grpo/commit/{'a' * 40}"


def test_an_unreachable_hub_is_one_line_and_the_model_stays(tiny_model, addition_data, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path, out = _config(tiny_model, addition_data, tmp_path, **HUB)
    # a token, which grpo validate requires before the run
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_TOKEN": "hf_test"}
    p = run_grpo("train", path, env=env)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: output.push_to_hub: uploading ") and "Traceback" not in p.stderr
    assert os.path.isfile(os.path.join(out, "final", "model.safetensors"))
    assert os.path.isfile(os.path.join(out, "summary.json"))


def test_pushing_without_a_repository_is_refused_first(tiny_model, addition_data, tmp_path):
    cfg = config.validate(
        make_config(tiny_model, addition_data, str(tmp_path), output={"push_to_hub": True})
    )
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg)
    assert "output.hub_model_id: needed with output.push_to_hub (user/name)" in str(err.value)


def test_a_hub_that_never_answers_times_out(tiny_model, addition_data, tmp_path):
    """A real server on 127.0.0.1 whose kernel accepts connections (the listen backlog) and
    which never reads or answers: huggingface_hub alone waits forever."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        path, out = _config(tiny_model, addition_data, tmp_path, **HUB)
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{s.getsockname()[1]}", "HF_TOKEN": "hf_test"}
        # the push's limit is 2 s a request; the subprocess's 600 s is a hang guard only
        p = run_grpo("train", path, env={**env, "GRPO_CORE_HUB_TIMEOUT": "2"})
    assert p.returncode == 2, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: output.push_to_hub: uploading ") and "Traceback" not in p.stderr
    assert "timed out" in last.lower(), last
    assert os.path.isfile(os.path.join(out, "final", "model.safetensors"))
