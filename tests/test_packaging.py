"""What `pip install hvdk8s` really installs: every package folder, all inside the `hvdk8s` namespace."""
import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT

FOLDERS = {"hvdk8s": "hvdk8s", "mpijob": "hvdk8s/mpijob", "models": "hvdk8s/models", "data": "hvdk8s/data",
           "bench": "hvdk8s/bench"}


def test_the_wheel_holds_every_module_and_no_generic_top_level_name(tmp_path):
    # Build from a clean copy: setuptools reuses an existing build/ folder, which can hide a missing package.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("hvdk8s-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{package}/{path.relative_to(ROOT / folder).as_posix()}"
                for folder, package in FOLDERS.items() for path in (ROOT / folder).rglob("*.py")}
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert "hvdk8s/dashboards/hvdk8s-training.json" in names  # package data: the Grafana dashboard
    assert "hvdk8s/native/allreduce-rules.conf" in names  # and the ranks' allreduce rules (hvdk8s/tuning.py)
    assert any(n.startswith("hvdk8s/_sleepy_negotiation.") and n.endswith(".so") for n in names)  # built, not copied
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"hvdk8s"}
