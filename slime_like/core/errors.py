"""The error types every layer raises or catches, each naming what the user can change."""

from __future__ import annotations


class ArgumentError(ValueError):
    """A command-line flag (or combination of flags) that cannot work; the message names the flag."""


class PluginError(ValueError):
    """A plugin path that cannot be imported or does not have the expected shape."""


class EngineError(RuntimeError):
    """A call to an SGLang server or the router that failed or timed out; the message names the URL."""


class WeightUpdateError(EngineError):
    """A weight update that did not complete on some server."""


class NodeLostError(RuntimeError):
    """A Ray node the run placed trainer ranks or engines on died; the message names it and what it held."""


class RolloutFailedError(RuntimeError):
    """Every sample of a rollout failed (generation or reward): the step would train on nothing."""
