"""Errors of the model build, each with a message meant for the person running it."""


class BuildError(RuntimeError):
    """A model cannot be built; the message says why and what to do."""
