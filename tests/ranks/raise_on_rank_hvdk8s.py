"""raise_on_rank.py written against hvdk8s's adapter, as a script job of hvdk8s's own."""
import sys

import torch

import hvdk8s.torch as ht

ht.init()
ht.allreduce(torch.ones(1), name="both-up")
if ht.rank() == int(sys.argv[1]):
    raise RuntimeError(f"boom on rank {ht.rank()}")
ht.allreduce(torch.ones(1), name="then")
