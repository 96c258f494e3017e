"""Runs on 2 real Horovod ranks as a user's script would: metrics through `hvdk8s.torch.metrics(port=...)`,
a few distributed steps recorded, then rank 0 scrapes the node's endpoint (which must answer for both
ranks) while rank 1 still serves. Writes OUT/rank<r>.json."""
import json
import sys
import urllib.request
from pathlib import Path

import torch

import hvdk8s.torch as ht
from prometheus_client.parser import text_string_to_metric_families

out_dir, port = Path(sys.argv[1]), int(sys.argv[2])
ht.init()
rank = ht.rank()
m = ht.metrics(port=port)
model = torch.nn.Linear(8, 2)
optimizer = ht.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))
batches = [(torch.randn(4 + rank, 8), torch.randint(0, 2, (4 + rank,))) for _ in range(5)]
m.begin_epoch(1)
for x, y in m.timed(batches):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    m.step(len(x), loss=loss.item)
m.observe(loss=0.25 + rank, accuracy=0.5)
ht.save_checkpoint(str(out_dir / "ckpt"), 1, model, optimizer)

ht.allreduce(torch.zeros(1), name="recorded")  # both ranks have recorded everything
samples = {}
if rank == 0:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[s.labels.get("rank", "?") + "|" + s.labels.get("le", "")] = s.value
ht.allreduce(torch.zeros(1), name="scraped")  # rank 1 serves until rank 0 has scraped
(out_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "samples": samples}))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
