"""`hvdk8s.torch` and `hvdk8s.tensorflow` honour one contract (hvdk8s._adapter.CONTRACT): the same verbs
with the same parameters, so a script moves between frameworks by changing its import."""
import inspect
import subprocess
import sys

import pytest

from hvdk8s._adapter import CONTRACT

pytestmark = pytest.mark.tensorflow_here  # hvdk8s.tensorflow, imported here (tests/workgroups.py)


@pytest.fixture(scope="module")
def adapters():
    import hvdk8s.tensorflow as htf
    import hvdk8s.torch as ht

    return {"torch": ht, "tensorflow": htf}


def parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


# The verbs issue 8 names, spelled out here so that dropping one from CONTRACT fails a test.
NAMED_VERBS = ("init", "distribute", "broadcast_state", "load_checkpoint", "save_checkpoint", "scaled_learning_rate",
               "metric_average", "metric_sum", "allreduce", "log", "is_rank0", "rank", "size", "local_rank",
               "local_size")


def test_the_contract_holds_every_named_verb():
    assert [v for v in NAMED_VERBS if v not in CONTRACT] == []


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_save_checkpoint_carries_extra_state(adapters, framework):
    assert "extra" in inspect.signature(adapters[framework].save_checkpoint).parameters


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_all_lists_the_contract_and_only_names_that_exist(adapters, framework):
    module = adapters[framework]
    assert set(CONTRACT) <= set(module.__all__), f"missing: {sorted(set(CONTRACT) - set(module.__all__))}"
    assert len(module.__all__) == len(set(module.__all__))
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


@pytest.mark.parametrize("name", CONTRACT)
def test_both_adapters_take_the_same_parameters(adapters, name):
    ht, htf = getattr(adapters["torch"], name), getattr(adapters["tensorflow"], name)
    assert callable(ht) == callable(htf)
    if callable(ht):
        assert parameters(ht) == parameters(htf)
    else:  # constants (the reduction ops) mean the same
        assert ht == htf


def test_adapters_do_not_import_the_trainer():
    """The adapters sit below the trainer: importing one must not pull in hvdk8s.train* (an import cycle)."""
    code = ("import sys, hvdk8s.tensorflow, hvdk8s.torch; "
            "print(sorted(m for m in sys.modules if m.startswith('hvdk8s.train')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == "[]"
