"""One config currency: past ``grpo_core/config/`` the run's configuration is read through the
typed view (grpo_core.config.view), never by subscripting a section dict, so a misspelt key is
an AttributeError that the type checker reports, not a KeyError at step 300."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a subscript of a config dict by a literal key: ``cfg["sampling"]``, ``data_cfg["path"]``
SUBSCRIPT = re.compile(r"""cfg\[["']""")


def _offenders(folder: Path, skip: Path | None = None) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        if skip is not None and skip in path.parents:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SUBSCRIPT.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_no_config_dict_subscript_outside_config():
    core = ROOT / "grpo_core"
    found = _offenders(core, skip=core / "config") + _offenders(ROOT / "plugins")
    assert not found, "read the typed view (config.<section>.<key>) instead:\n" + "\n".join(found)


def test_the_rule_sees_a_subscript():
    """The pattern matches the forms it forbids (so the test above can fail)."""
    assert SUBSCRIPT.search('x = cfg["sampling"]["group_size"]')
    assert SUBSCRIPT.search("n = data_cfg['columns']")
    assert not SUBSCRIPT.search("n = config.sampling.group_size")
