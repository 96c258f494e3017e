"""The own-script examples of docs/training.md run on 2 real ranks, learn, checkpoint and resume (at 1 rank)."""
import re

import pytest

from conftest import ROOT, run_ranks

pytestmark = pytest.mark.ranks


@pytest.mark.parametrize("script", ["custom_torch.py", "custom_keras.py"])
def test_custom_script_trains_and_resumes(tmp_path, script):
    example = str(ROOT / "examples" / script)
    ckpt = tmp_path / "ckpt"
    first = run_ranks(example, ckpt, 6)
    acc = float(re.search(r"test accuracy ([\d.]+)%", first.stdout).group(1))
    assert acc >= 95.0, first.stdout
    assert first.stdout.count("test accuracy") == 1  # rank 0 only
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-00004.ckpt", "epoch-00005.ckpt", "epoch-00006.ckpt"]
    again = run_ranks(example, ckpt, 7, np=1)  # resumes at epoch 7, at another rank count
    assert sorted(p.name for p in ckpt.iterdir())[-1] == "epoch-00007.ckpt"
    assert float(re.search(r"test accuracy ([\d.]+)%", again.stdout).group(1)) >= 95.0
