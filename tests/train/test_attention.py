"""model.attn_implementation reaches from_pretrained; a kernel the machine cannot run is
refused in one line naming the field, by preflight (grpo validate) and at load time."""

from __future__ import annotations

import pytest
import torch
from helpers import make_config

from grpo_core import config, preflight
from grpo_core.config.view import view
from grpo_core.errors import ConfigError, UserError
from grpo_core.store.models import load_model


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_the_kernel_reaches_the_model(tiny_model, addition_data, tmp_path, kernel):
    cfg = config.validate(
        make_config(tiny_model, addition_data, str(tmp_path), model={"attn_implementation": kernel})
    )
    model = load_model(view(cfg).model, torch.device("cpu"))
    assert model.config._attn_implementation == kernel


def test_flash_attention_on_the_cpu_is_refused_in_one_line(tiny_model, addition_data, tmp_path):
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path),
            model={"attn_implementation": "flash_attention_2"},
        )
    )
    with pytest.raises(UserError, match="^model.attn_implementation: flash_attention_2 needs"):
        load_model(view(cfg).model, torch.device("cpu"))
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg)
    assert "model.attn_implementation: flash_attention_2 needs" in str(err.value)


def test_an_unknown_kernel_is_a_schema_error(tiny_model, addition_data, tmp_path):
    with pytest.raises(ConfigError, match="^model.attn_implementation: "):
        config.validate(
            make_config(
                tiny_model, addition_data, str(tmp_path), model={"attn_implementation": "flash"}
            )
        )
