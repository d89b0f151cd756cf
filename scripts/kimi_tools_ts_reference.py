#!/usr/bin/env python3
"""Kimi-K2.5's TypeScript tool declarations (`tools_ts_str`) by the reference code itself
(reference for crates/aerie-data/tests/chat_data/kimi_tools_ts.rs and, through `load()` and
`deep_sort_dict`, for scripts/render_chat_template.py).

  python scripts/kimi_tools_ts_reference.py TOOLS.json OUT.json

TOOLS.json: a list of `tools` values. OUT.json: for each, what K2.5's `apply_chat_template`
passes to its template: {"ts": STRING} (the template gets `tools_ts_str`), or {"raised": MESSAGE}
(`encode_tools_to_typescript_style` raised: the tokenizer passes none and the template falls
back to JSON), or {"ts": null} for a falsy `tools` (nothing computed).

The reference is `tool_declaration_ts.py` of the Kimi-K2.5 checkpoint, as PyPI's
`tinker-cookbook==0.6.1` ships it (`tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`,
"Copied from kimi-k2.5-hf-tokenizer/tool_declaration_ts.py"; python/requirements-test.txt installs
it with --no-deps). Only that one file is loaded, by path: it imports the standard library alone,
while importing the `tinker_cookbook` package would need its heavy dependencies. Its sha256 is
checked so that another version cannot silently become the reference.
"""

import hashlib
import importlib.util
import json
import logging
import pathlib
import sys

MODULE = "renderers/kimi_k2_5_tool_declaration_ts.py"
SHA256 = "03d1677d2cb111e5c71521e433cb72e4e7aa1c758ef1cdb40a9c08f4a3935dc4"


def load():
    """The reference module, loaded from the installed tinker-cookbook without importing it."""
    spec = importlib.util.find_spec("tinker_cookbook")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("tinker-cookbook is not installed (python/requirements-test.txt, --no-deps)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / MODULE
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        sys.exit(f"{path}: sha256 {digest}, expected {SHA256} (tinker-cookbook==0.6.1)")
    mod_spec = importlib.util.spec_from_file_location("kimi_tool_declaration_ts", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    # Its warning for `false` schemas goes to the log, never into the output.
    logging.getLogger(module.__name__).setLevel(logging.ERROR)
    return module


def deep_sort_dict(obj):
    """The Kimi tokenizer's `deep_sort_dict`, applied to `tools` before anything else (also
    render_chat_template.py's `sort_tools`)."""
    if isinstance(obj, dict):
        return {k: deep_sort_dict(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [deep_sort_dict(item) for item in obj]
    return obj


def tools_ts_str(module, tools):
    """What K2.5's `apply_chat_template` computes: (ts or None, the exception's text or None)."""
    tools = deep_sort_dict(tools)
    if not tools:
        return None, None
    try:
        return module.encode_tools_to_typescript_style(tools), None
    except Exception as e:  # noqa: BLE001 - the tokenizer catches everything too
        return None, f"{type(e).__name__}: {e}"


def main():
    module = load()
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    out = []
    for tools in cases:
        ts, raised = tools_ts_str(module, tools)
        out.append({"raised": raised} if raised is not None else {"ts": ts})
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
