"""The README stays true: its two commands exist and CI runs the test one; quoted examples are real."""
import re

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_leads_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert all((ROOT / c.split()[1]).is_file() for c in commands)
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("example", ["custom_torch.py", "custom_keras.py", "script/train.py"])
def test_quoted_example_code_is_the_tested_file(example):
    at = README.index(f"examples/{example}")
    block = re.search(r"```python\n(.*?)```", README[at:], re.S).group(1)
    source = (ROOT / "examples" / example).read_text()
    missing = [line for line in block.splitlines() if line.strip() not in ("", "...") and line not in source]
    assert not missing, f"README lines not in examples/{example}: {missing}"

