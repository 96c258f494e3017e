"""Model definitions behind one registry: `hvdk8s.models.build("resnet", "pytorch", {"depth": 20}, ...)`."""
from .registry import REGISTRY, build, get

__all__ = ["REGISTRY", "build", "get"]
