"""Sync and keep the hold the way `hvdk8s launch` does (the result dropped, the hold kept until this
process exits), then wait until stdin closes or the process is killed."""
import gc
import sys

from hvdk8s.data.cache import sync

sync(sys.argv[1], sys.argv[2], keep_hold=True)  # the result and its hold object go out of scope here
gc.collect()
print("synced", flush=True)
sys.stdin.read()
