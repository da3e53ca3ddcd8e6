"""The planner: each privacy mode's noise, ε per round and rounds affordable for a federation's
shape, computed by the code the runs use (``planner``; ``python -m fedpriv.planning``).

It sits above ``fedpriv.training`` and ``fedpriv.distributed`` (it calls their setup, as the
server does), so ``fedpriv.privacy`` (accounting) imports nothing above itself."""

from fedpriv.planning.planner import PLANNERS, Federation, plan, plot, table

__all__ = ["PLANNERS", "Federation", "plan", "plot", "table"]
