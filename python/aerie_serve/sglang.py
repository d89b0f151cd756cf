"""`python -m aerie_serve sglang ARGS...`: SGLang's own `sglang.launch_server`, unchanged on a GPU,
kept on the attention path EAGLE needs when it runs on a CPU. `python -m aerie_serve sglang
--version-json` prints the engine's name, distribution and version as one JSON line.

On `--device cpu` (facts of a hand run: shared/reference/sglang-cpu.md):
- `SGLANG_USE_CPU_ENGINE=1` is set (without it SGLang 0.5.23's CPU scheduler dies importing vLLM's
  rotary op);
- the `intel_amx` attention backend is kept. EAGLE on the CPU accepts no other backend, but
  SGLang's argument resolution rewrites `intel_amx` to `torch_native` whenever its AMX-packed
  kernels are missing (the post-process pass `_attention_backend_platform_fallbacks`), which is
  always so without SGLang's compiled CPU kernels and on every CPU without AMX. That one rewrite is
  skipped; the pass still runs for every other platform and backend.

`AERIE_SGLANG_TEST_KERNELS=DIR` puts DIR first on the path of the server and of every process it
starts: the test suite's stand-in `sgl_kernel` (python/tests/sglang_cpu) is found only that way,
never otherwise.

The server runs under the same supervisor as vLLM's (`aerie_serve.__main__.supervised`), so it
never outlives whoever started it.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import sys

from aerie_serve import flag_value

# The variable naming the test-only `sgl_kernel` directory.
TEST_KERNELS_ENV = "AERIE_SGLANG_TEST_KERNELS"


def device_of(args: list[str]) -> str | None:
    """The value of `--device` in SGLang's arguments (either spelling), or None."""
    return flag_value(args, "--device")


def use_test_kernels(directory: str) -> None:
    """Put `directory` (holding the test stand-in `sgl_kernel`) first on this process's path and on
    `PYTHONPATH`, which the scheduler and detokenizer processes SGLang spawns inherit."""
    if not os.path.isfile(os.path.join(directory, "sgl_kernel", "__init__.py")):
        raise SystemExit(f"aerie_serve: {TEST_KERNELS_ENV}={directory} holds no sgl_kernel/__init__.py")
    sys.path.insert(0, directory)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = directory + (os.pathsep + old if old else "")


def keep_intel_amx_on_cpu() -> None:
    """Replace SGLang's `_attention_backend_platform_fallbacks` pass, in the registry and where
    `attention_hook` imported it by name, with one that leaves `intel_amx` on the CPU alone and
    defers to the original for everything else. Fails loudly if the seam moved (another SGLang)."""
    from sglang.srt.arg_groups import attention_hook, overrides

    name = "_attention_backend_platform_fallbacks"
    original = getattr(overrides, name, None)
    if original is None or getattr(attention_hook, name, None) is not original:
        raise SystemExit(
            f"aerie_serve: sglang.srt.arg_groups.overrides.{name} is not where SGLang 0.5.23 has it: "
            "this SGLang's CPU attention fallback cannot be kept off (see python/aerie_serve/sglang.py)"
        )

    def fallbacks_keeping_intel_amx(view) -> dict:
        if view.attention_backend == "intel_amx" and view.device == "cpu":
            return {}
        return original(view)

    fallbacks_keeping_intel_amx.__qualname__ = name
    passes = overrides.POST_PROCESS_PASSES
    passes[:] = [fallbacks_keeping_intel_amx if p is original else p for p in passes]
    setattr(overrides, name, fallbacks_keeping_intel_amx)
    setattr(attention_hook, name, fallbacks_keeping_intel_amx)


def version_json() -> str:
    return json.dumps({"engine": "sglang", "distribution": "sglang", "version": metadata.version("sglang")})


def main(args: list[str]) -> int:
    """Run `sglang.launch_server` with `args` (see the module docstring)."""
    try:
        metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise SystemExit(
            f"aerie_serve: no SGLang in this Python environment ({sys.prefix}): install "
            "python/requirements-sglang.txt (or sglang==0.5.23 on a GPU host)"
        ) from None
    if args == ["--version-json"]:
        print(version_json())
        return 0
    kernels = os.environ.get(TEST_KERNELS_ENV)
    if kernels:
        use_test_kernels(kernels)
    cpu = device_of(args) == "cpu"
    if cpu:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"

    def serve() -> int:
        import runpy

        if cpu:
            keep_intel_amx_on_cpu()
        sys.argv = ["sglang.launch_server", *args]
        runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        return 0

    if any(a in ("-h", "--help") for a in args):
        return serve()
    from aerie_serve.__main__ import supervised

    return supervised(serve)
