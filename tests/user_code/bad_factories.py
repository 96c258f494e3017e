"""Factories that go wrong in the ways a user's do (tests/test_user_code.py names each in a job file)."""
NOT_CALLABLE = 42


def raises(**kwargs):
    raise RuntimeError("the user's factory broke")


def not_a_model(**kwargs):
    return "a string, not a model"


def not_a_dataset(**kwargs):
    return 42


def empty_dataset(**kwargs):
    return []


def bad_split(**kwargs):
    return {"train": [(1.0, 0)], "validation": [(1.0, 0)]}
