"""``nn.GRU`` and ``nn.RNN`` for per-example gradients: torch's fused kernels write into a
hidden state that ``torch.func.vmap`` cannot batch, so ``fix_recurrent`` swaps each for
``VmapRNN``, the same recurrence in plain tensor ops over the very same ``Parameter``s
(state-dict keys and values unchanged: the arrays on the wire are the same), as Opacus'
``DPGRU``/``DPRNN`` do. ``nn.LSTM`` runs under vmap as it is. Packed sequences are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VmapRNN(nn.Module):
    """``rnn``'s computation (GRU, or tanh/ReLU RNN; any layers, bidirectional, batch_first,
    inter-layer dropout, an optional h_0) from its own parameters, one time step at a time."""

    def __init__(self, rnn: nn.GRU | nn.RNN) -> None:
        super().__init__()
        self.mode, self.hidden_size, self.num_layers = rnn.mode, rnn.hidden_size, rnn.num_layers
        self.batch_first, self.dropout, self.bias = rnn.batch_first, rnn.dropout, rnn.bias
        self.directions = 2 if rnn.bidirectional else 1
        for name in rnn._flat_weights_names:
            self.register_parameter(name, getattr(rnn, name))

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(x, torch.Tensor):
            raise TypeError("packed sequences are not supported under per-example gradients: pad them")
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0 if self.batch_first else 1)
            h0 = None if h0 is None else h0.unsqueeze(1)
        steps = x.unbind(1 if self.batch_first else 0)
        if h0 is None:
            h0 = x.new_zeros(self.num_layers * self.directions, steps[0].shape[0], self.hidden_size)
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.directions):
                h = h0[layer * self.directions + direction]
                order = range(len(steps)) if direction == 0 else range(len(steps) - 1, -1, -1)
                out: list[torch.Tensor] = [h] * len(steps)
                for t in order:
                    h = self._cell(steps[t], h, layer, direction)
                    out[t] = h
                outputs.append(torch.stack(out))
                finals.append(h)
            stacked = torch.cat(outputs, dim=-1)  # (T, B, directions·H)
            if self.dropout and self.training and layer < self.num_layers - 1:
                stacked = F.dropout(stacked, self.dropout, True)
            steps = stacked.unbind(0)
        output = torch.stack(steps, 1 if self.batch_first else 0)
        h_n = torch.stack(finals)
        return (output.squeeze(0 if self.batch_first else 1), h_n.squeeze(1)) if unbatched else (output, h_n)

    def _cell(self, x: torch.Tensor, h: torch.Tensor, layer: int, direction: int) -> torch.Tensor:
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        gi = F.linear(x, getattr(self, "weight_ih" + suffix), getattr(self, "bias_ih" + suffix, None))
        gh = F.linear(h, getattr(self, "weight_hh" + suffix), getattr(self, "bias_hh" + suffix, None))
        if self.mode == "GRU":
            ir, iz, in_ = gi.chunk(3, -1)
            hr, hz, hn = gh.chunk(3, -1)
            r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
            n = torch.tanh(in_ + r * hn)
            return (1 - z) * n + z * h
        return torch.tanh(gi + gh) if self.mode == "RNN_TANH" else torch.relu(gi + gh)


def fix_recurrent(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.GRU`` and ``nn.RNN`` (or the model itself) swapped for a
    ``VmapRNN`` over the same parameters; other layers untouched."""
    if isinstance(model, nn.GRU | nn.RNN):
        return VmapRNN(model)
    for name, child in model.named_children():
        setattr(model, name, fix_recurrent(child))
    return model
