"""Hold a cached dataset like a running job does, until stdin closes or the process is killed."""
import sys

from hvdk8s.data.cache import hold

with hold(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
