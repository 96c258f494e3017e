"""Run one sync in its own process and print the SyncResult as JSON: tests start several at once."""
import dataclasses
import json
import sys

from hvdk8s.data.cache import sync

result = sync(sys.argv[1], sys.argv[2], workers=4)
print(json.dumps({**dataclasses.asdict(result), "path": str(result.path)}))
