#!/usr/bin/env python3
"""Render chat templates with jinja2 exactly as transformers' `apply_chat_template` sets it up
(reference for crates/aerie-data/tests/chat_data/kimi_templates.rs).

  python scripts/render_chat_template.py CASES.json OUT.json

CASES.json: a list of {template (path), messages, tools (or null), add_generation_prompt,
kwargs, special_tokens, sort_tools}. OUT.json: the list of rendered strings (or
{"error": message}). The environment is transformers' `_compile_jinja_template`: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, its own
`tojson` (json.dumps with ensure_ascii=False), `raise_exception` and `strftime_now`.
`sort_tools` applies the Kimi tokenizer's `deep_sort_dict` (scripts/kimi_tools_ts_reference.py's)
to `tools` first, as its `apply_chat_template` override does; `kimi_tools_ts` also computes
`tools_ts_str` as Kimi-K2.5's override does, with the reference module (that same script: passed
when the encoder returns, left out when it raises).
"""

import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

import kimi_tools_ts_reference as ref  # beside this script


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = {}
    tools_ts_module = None
    out = []
    for c in cases:
        path = c["template"]
        if path not in compiled:
            compiled[path] = env.from_string(open(path, encoding="utf-8").read())
        tools = c.get("tools")
        if tools is not None and c.get("sort_tools"):
            tools = ref.deep_sort_dict(tools)
        kwargs = dict(c.get("kwargs", {}))
        if c.get("kimi_tools_ts") and "tools_ts_str" not in kwargs:
            if tools_ts_module is None:
                tools_ts_module = ref.load()
            ts, _ = ref.tools_ts_str(tools_ts_module, tools)
            if ts is not None:
                kwargs["tools_ts_str"] = ts
        try:
            out.append(
                compiled[path].render(
                    messages=c["messages"],
                    tools=tools,
                    documents=None,
                    add_generation_prompt=c["add_generation_prompt"],
                    **c.get("special_tokens", {}),
                    **kwargs,
                )
            )
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.append({"error": str(e)})
    json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)


if __name__ == "__main__":
    main()
