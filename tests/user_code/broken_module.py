"""A module that cannot be imported (its factory must be reported, not its traceback)."""
def build(:
    pass
