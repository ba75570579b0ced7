"""Click options made from the policies' own declarations, for `marbled` and `marble simulate`."""

from __future__ import annotations

from collections.abc import Callable

import click

from marbled.core.policy import POLICIES, Policy, all_options, get_policy


def policy_summaries() -> str:
    """Every policy with its one-line summary, for a --policy help text."""
    return "; ".join(f"{name}: {cls.summary}" for name, cls in sorted(POLICIES.items()))


def policy_settings(command: Callable) -> Callable:
    """One option for each setting any policy declares (e.g. --time-slice)."""
    for option, policies in reversed(all_options().values()):
        command = click.option(
            option.flag, option.name, default=option.default, show_default=True,
            type=click.FloatRange(min=option.minimum, min_open=option.positive,
                                  max=option.maximum),
            help=f"With --policy {' or '.join(policies)}: {option.help}.")(command)
    return command


def make_policy(name: str, params: dict) -> Policy:
    """The policy `name` with the settings of `policy_settings` found in `params`."""
    try:
        return get_policy(name, **{k: params.get(k) for k in all_options()})
    except ValueError as exc:  # e.g. the learned policy's weights file is missing
        raise click.ClickException(str(exc)) from None
