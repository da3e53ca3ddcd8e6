"""An SGD that records the gradient it is handed each step: the privatised one, so tests can
compare two ways of computing a DP-SGD step (captured or padded against eager)."""

import torch


def recording_sgd(model: torch.nn.Module, lr: float) -> tuple[torch.optim.SGD, list[torch.Tensor]]:
    """SGD over ``model`` and the list it appends a flat copy of every step's gradients to."""
    seen: list[torch.Tensor] = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(torch.cat([p.grad.detach().flatten().clone() for p in model.parameters()]))
            return super().step(closure)

    return Recording(model.parameters(), lr=lr), seen
