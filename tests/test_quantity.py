"""Kubernetes quantities: the grammar, the helpers built on it, and what `hvdk8s render` does with any
`--set resources.cpu=...` / `resources.memory=...` a user may type (render, or exit 2 naming the field)."""
from __future__ import annotations

from decimal import Decimal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DIGITS_JOB, cli, cpu_bounded
from hvdk8s.core.quantity import MAX_LENGTH, cpu_cores, parse_bytes, parse_quantity
from hvdk8s.data.cache.sizes import parse_size
from hvdk8s.mpijob import render as renderer
from hvdk8s.spec import JobFileError, load_job

SLOTS = 2  # examples/digits.yaml: ranks_per_worker


@pytest.mark.parametrize("text,value", [
    ("4", "4"), ("0", "0"), ("+1", "1"), ("-1", "-1"),
    ("1.5", "1.5"), (".5", "0.5"), ("5.", "5"),
    ("500m", "0.5"), ("2k", "2000"), ("1M", "1000000"), ("3E", "3e18"), ("7n", "7e-9"), ("7u", "7e-6"),
    ("16Gi", str(16 * 2**30)), ("1.5Gi", str(3 * 2**29)), ("1Ki", "1024"), ("1Ei", str(2**60)),
    ("1e3", "1000"), ("1E3", "1000"), ("1E-2", "0.01"), ("2.5e+2", "250"), (".5e1", "5"),
    (2, "2"), (0.25, "0.25"), (1e20 / 1e10, "1e10"),
])
def test_valid_quantities_have_their_exact_value(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", [
    "", " ", "2x", "16GB", "16gi", "1Ki5", "k", "Mi", ".", "+", "-", "1e", "e3", "1e1.5", "1.2.3", "1 Gi",
    " 4", "4 ", "4\n", "0x10", "1_000", "inf", "nan", "١", "1e+", "1ee3", "--1", "1m1", True, None, [1],
])
def test_invalid_quantities_are_refused_with_examples(text):
    with pytest.raises(ValueError, match="is not a Kubernetes quantity .*examples: 4, 500m, 16Gi"):
        parse_quantity(text)


@pytest.mark.parametrize("text,words", [
    ("1e100", "out of range"), ("1E-999999999", "out of range"), ("9" * 60 + "e99", "out of range"),
    ("8Ei", "2^63-1"), ("9223372036854775808", "2^63-1"),
    ("1" * (MAX_LENGTH + 1), f"at most {MAX_LENGTH} characters"),
])
def test_out_of_range_and_overlong_inputs_are_refused(text, words):
    with pytest.raises(ValueError, match=words.replace("^", r"\^")):
        parse_quantity(text)
    assert parse_quantity("9223372036854775807") == 2**63 - 1  # the largest one Kubernetes holds


def test_huge_inputs_are_refused_fast():
    for text in ("9" * 10**6, "1e" + "9" * 10**6, "1" + "e9" * 10**5, "1e999999999999"):
        with cpu_bounded(0.5, text[:20]), pytest.raises(ValueError):
            parse_quantity(text)


def test_cpu_cores_and_bytes():
    assert cpu_cores("500m") == 0.5 and cpu_cores("2k") == 2000.0 and cpu_cores(3) == 3.0
    assert parse_bytes("16Gi") == 16 * 2**30 and parse_bytes("1.5Ki") == 1536 and parse_bytes("500M") == 5 * 10**8
    assert parse_bytes("1e3") == 1000 and parse_bytes(0) == 0
    assert parse_size is parse_bytes  # the cache's --quota parser is the same one
    with pytest.raises(ValueError, match=r"0\.5 bytes.*did you mean 500M\?"):
        parse_bytes("500m")
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        parse_bytes("1.5")
    with pytest.raises(ValueError, match="negative"):
        parse_bytes("-1Gi")


# --- what render does with a quantity from the command line ---------------------------------------

def omp_threads(spec) -> int:
    return int(renderer.rank_env(spec, renderer.plan(spec.resources))["OMP_NUM_THREADS"])


@pytest.mark.parametrize("cpu,threads", [("2k", 1000), ("500m", 1), ("3", 1), ("64", 32), ("1e2", 50),
                                         ("4.", 2), ("9", 4), ("0", 1)])
def test_omp_threads_follow_the_cpu_quantity(cpu, threads):
    assert omp_threads(load_job(DIGITS_JOB, [f"resources.cpu={cpu}"])) == threads


def test_render_with_cpu_2k_succeeds_from_the_cli():
    proc = cli("render", DIGITS_JOB, "--set", "resources.cpu=2k")
    assert proc.returncode == 0, proc.stderr
    configmap, job = yaml.safe_load_all(proc.stdout)
    envs = [e for spec in job["spec"]["mpiReplicaSpecs"].values()
            for c in spec["template"]["spec"]["containers"] for e in c.get("env", [])]
    assert {"name": "OMP_NUM_THREADS", "value": "1000"} in envs
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["cpu"] == "2k"  # passed on as written


def _renders_or_names_the_field(field: str, text: str) -> None:
    """The in-process path of `hvdk8s render --set FIELD=TEXT`: a full render, or a JobFileError on FIELD."""
    try:
        spec = load_job(DIGITS_JOB, [f"{field}={text}"])
    except JobFileError as e:
        assert [path for path, _ in e.problems] == [field], e
        return
    renderer.to_yaml(renderer.render(spec))
    section, name = field.split(".")
    value = getattr(getattr(spec, section), name)
    if value is None:  # an empty cache_quota: no quota
        assert field == "kubernetes.cache_quota"
        return
    amount = parse_quantity(value)
    assert amount >= 0
    if field == "resources.cpu":  # whole cores per rank, exactly (a float is off for e.g. .1Ei)
        assert omp_threads(spec) == max(1, int(amount // SLOTS))


def _quantity_like() -> st.SearchStrategy[str]:
    """Strings near the grammar: valid ones, and ones a character or two away."""
    number = st.one_of(st.from_regex(r"[0-9]{1,20}(\.[0-9]{0,6})?", fullmatch=True),
                       st.from_regex(r"\.[0-9]{1,6}", fullmatch=True))
    suffix = st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
                              "e3", "E-2", "e+18", "e99", "e100", "i", "KI", "b", "Gb", " Gi", "e", "e1.5"])
    return st.builds(lambda sign, n, s: sign + n + s, st.sampled_from(["", "", "+", "-"]), number, suffix)


# database=None: runs do not depend on examples saved by earlier runs
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(["resources.cpu", "resources.memory", "resources.shm_size", "kubernetes.cache_quota"]),
       text=st.one_of(st.text(max_size=30), _quantity_like()))
def test_any_typed_quantity_renders_or_names_the_field(field, text):
    _renders_or_names_the_field(field, text)


@pytest.mark.parametrize("field,text,rc", [
    ("resources.cpu", "1.5e3", 0), ("resources.memory", "1.5Gi", 0), ("resources.cpu", "-2", 2),
    ("resources.cpu", "2x", 2), ("resources.memory", "1e400", 2), ("resources.memory", "{", 2),
    ("resources.cpu", "9" * 100, 2),
])
def test_the_cli_renders_or_exits_2_naming_the_field(field, text, rc):
    proc = cli("render", DIGITS_JOB, "--set", f"{field}={text}")
    assert proc.returncode == rc and "Traceback" not in proc.stderr, proc.stderr
    if rc:
        assert f"  {field}:" in proc.stderr, proc.stderr
