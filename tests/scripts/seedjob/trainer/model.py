"""The seed job's model: a small MLP regression."""

import torch


class Net(torch.nn.Module):
    def __init__(self, input_dim: int, hidden: int):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(input_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        )

    def forward(self, x):
        return self.layers(x)
