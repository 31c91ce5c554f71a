#!/usr/bin/env python3
"""Renders chat templates as transformers' apply_chat_template does, with Python's jinja2.

The independent reference for crescent's Jinja engine (src/model/jinja): the same environment as
transformers' _compile_jinja_template (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, {% generation %}, tojson, raise_exception, strftime_now) and the same variables.

  render_reference.py CASES.json OUT.json
CASES.json: {"cases": [{"source": TEXT, "variables": {...}} | {"template": PATH, "messages": [...], "tools": [...] | null,
  "add_generation_prompt": bool, "continue_final_message": bool, "kwargs": {...},
  "bos_token": str | null, "eos_token": str | null}]}
OUT.json: [{"ok": true, "text": ...} | {"ok": false, "kind": "TemplateError" | ..., "error": ...}]
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """transformers' {% generation %} tag: the body renders as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def continue_final(rendered, chat):
    final_message = chat[-1]["content"]
    if isinstance(final_message, (list, tuple)):
        for block in reversed(final_message):
            if "text" in block:
                final_message = block["text"]
                break
        else:
            raise ValueError("no text to continue in the final message")
    if final_message.strip() not in rendered:
        raise ValueError("the final message does not appear in the chat")
    loc = rendered.rindex(final_message.strip())
    if rendered[loc:loc + len(final_message.lstrip())] == final_message:
        return rendered[:loc + len(final_message.lstrip())]
    return rendered[:loc + len(final_message.strip())]


def render(env, case):
    if "source" in case:
        # A bare template with its variables (the engine's expression tests).
        return env.from_string(case["source"]).render(**case.get("variables", {}))
    with open(case["template"], encoding="utf-8") as f:
        template = env.from_string(f.read())
    special = {k: case[k] for k in ("bos_token", "eos_token") if case.get(k) is not None}
    kwargs = {**special, **case.get("kwargs", {})}
    if case.get("continue_final_message") and case.get("add_generation_prompt"):
        raise ValueError("continue_final_message and add_generation_prompt")
    text = template.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                           add_generation_prompt=case.get("add_generation_prompt", False),
                           **kwargs)
    if case.get("continue_final_message"):
        text = continue_final(text, case["messages"])
    return text


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    env = make_env()
    out = []
    for case in cases:
        try:
            out.append({"ok": True, "text": render(env, case)})
        except Exception as e:  # every failure is an expected "error" outcome to compare
            out.append({"ok": False, "kind": type(e).__name__, "error": str(e)})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
