"""The torch side of the learned policy: the scorer network, its training on labels, its
export to numpy, and the actor-critic policy that MaskablePPO fine-tunes it as.

The scorer is one MLP applied alike to every move's row beside the state's global entries
(`core.features`); `Network` (numpy) is its twin for deciding. Needs the `rl` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from marbled.core.features import ACTIONS, GLOBAL, ROW
from marbled.core.policy.learned import Network
from marbled.sim.imitate import Samples


def scorer_module(hidden: Sequence[int]) -> nn.Sequential:
    """An MLP from [global entries, row] to one logit: tanh hidden layers."""
    sizes = [GLOBAL + ROW, *hidden, 1]
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if k < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def score(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits (batch, ACTIONS) of observations `x` (batch, DIM): every row, allowed or not
    (MaskablePPO masks them itself)."""
    g = x[:, :GLOBAL].unsqueeze(1).expand(-1, ACTIONS, -1)
    return mlp(torch.cat([g, x[:, GLOBAL:].reshape(-1, ACTIONS, ROW)], dim=2)).squeeze(2)


def export(mlp: nn.Sequential) -> Network:
    """The numpy `Network` of a torch scorer."""
    linear = [m for m in mlp if isinstance(m, nn.Linear)]
    return Network(tuple(m.weight.detach().double().numpy().T.copy() for m in linear),
                   tuple(m.bias.detach().double().numpy().copy() for m in linear))


def fit(mlp: nn.Module, data: Samples, *, epochs: int, seed: int, batch: int = 256,
        lr: float = 1e-3, log: Callable[[str], None] | None = None) -> list[float]:
    """Minus the log-probability of the teacher's moves (any of those it makes at that
    instant: the order of its list is not a preference) among the allowed ones; the mean
    loss of each epoch."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(mlp.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    counts = np.diff(data.offsets)
    losses = []
    for epoch in range(epochs):
        order, total = rng.permutation(len(data)), 0.0
        for k in range(0, len(data), batch):
            i = order[k:k + batch]
            width = int(counts[i].max())
            # each decision's rows, padded to the widest of the batch
            pos = np.arange(width)[None, :]
            valid = pos < counts[i][:, None]
            take = np.where(valid, data.offsets[i][:, None] + pos, 0)
            rows = torch.as_tensor(data.rows[take])
            g = torch.as_tensor(data.g[i]).unsqueeze(1).expand(-1, width, -1)
            logits = mlp(torch.cat([g, rows], dim=2)).squeeze(2)
            logits = logits.masked_fill(~torch.as_tensor(valid), -1e9)
            hit = torch.as_tensor(valid & data.target[take])
            # minus the log of the probability of the teacher's moves, together
            loss = (logits.logsumexp(1) - logits.masked_fill(~hit, -1e9).logsumexp(1)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(i)
        losses.append(total / max(len(data), 1))
        if log:
            log(f"  epoch {epoch + 1}: loss {losses[-1]:.4f}")
    return losses


class _ActorCritic(nn.Module):
    """MaskablePPO's latent networks: the actor gives the logits itself (the policy's
    action net is the identity); the critic reads the global entries and the mean row."""

    def __init__(self, hidden: Sequence[int]):
        super().__init__()
        self.actor = scorer_module(hidden)
        self.critic = nn.Sequential(nn.Linear(GLOBAL + ROW, hidden[0]), nn.Tanh(),
                                    nn.Linear(hidden[0], hidden[-1]), nn.Tanh())
        self.latent_dim_pi, self.latent_dim_vf = ACTIONS, hidden[-1]

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return score(self.actor, features)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        rows = features[:, GLOBAL:].reshape(-1, ACTIONS, ROW)
        present = rows[:, :, :1]
        mean = (rows * present).sum(1) / present.sum(1).clamp(min=1.0)
        return self.critic(torch.cat([features[:, :GLOBAL], mean], dim=1))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)


class ScorerPolicy(MaskableActorCriticPolicy):
    """sb3-contrib's masked actor-critic with the scorer as its actor (`hidden`: its
    layers)."""

    def __init__(self, *args, hidden: Sequence[int] = (64, 64), **kwargs):
        self.hidden = tuple(hidden)
        super().__init__(*args, ortho_init=False, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = _ActorCritic(self.hidden)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()  # the actor's outputs are the logits
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),
                                              **self.optimizer_kwargs)
