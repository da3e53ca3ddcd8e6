"""Secure aggregation (SecAgg+ on the full graph) for distributed DP: the server learns only
the modular sum of the surviving nodes' vectors (``docs/distributed.md``). Protocol logic only;
``server.secure_sum`` and ``clients.secure_sum`` carry it over Flower messages."""

from fedpriv.secagg.node import NodeState, Requirements, SecAggRefusal, StageInfo, Vector, answer
from fedpriv.secagg.server import SecureAggregation, SecureSumResult
from fedpriv.secagg.stages import RECORD_KEY, Stage

__all__ = ["RECORD_KEY", "NodeState", "Requirements", "SecAggRefusal", "SecureAggregation", "SecureSumResult",
           "Stage", "StageInfo", "Vector", "answer"]
