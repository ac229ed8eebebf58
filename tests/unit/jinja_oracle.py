#!/usr/bin/env python3
"""Renders Jinja templates with Python's jinja2 as Hugging Face runs chat templates: the oracle of
tests/unit/test_jinja.cpp. Input (argv[1], JSON): {"cases": [{"template": SOURCE, "context": {...}}]}.
Output (stdout, JSON): [{"ok": true, "text": ...} | {"ok": false, "error": ...}], one per case."""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' chat-template tojson (jinja2's own escapes HTML characters and sorts keys).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    out = []
    for case in cases:
        try:
            out.append({"ok": True, "text": env.from_string(case["template"]).render(**case["context"])})
        except Exception as e:  # noqa: BLE001 - every failure is a result to compare
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
