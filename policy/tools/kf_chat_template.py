#!/usr/bin/env python3
"""Chat templates of HF model folders, rendered with jinja2 as transformers renders them.

The C++ side (policy/src/chat_template.cpp) does not interpret Jinja. For each sequence of
message roles it asks this script once for a *layout*: the template rendered with sentinel
strings in place of the message contents, split into literal pieces and slots. The C++ side
then joins the pieces around the real contents. That is exact when the template only places
a content (possibly trimmed with `| trim`) and does not branch on its text. This script
proves it for the role sequence with probe contents (leading/trailing whitespace, Unicode
spaces, Jinja-looking text, special-token text, "</think>", empty strings, equal and unequal
contents): each probe is rendered by jinja2 and by the layout, and any difference is an
error, so a template the sentinel method cannot render exactly is refused rather than
approximated by the layout: the layout says {"exact": true} instead, and the C++ side renders
every conversation of that role sequence with `serve` (a process that keeps the compiled
template and renders one conversation per request with jinja2 itself, as transformers does).
Contents whose emptiness changes the output (`{% if message.content %}`) are marked: the C++
side then refuses an empty content for that slot of a layout.

Usage:
  kf_chat_template.py layout MODEL_DIR ROLE [ROLE ...]   -> JSON layout on stdout
  kf_chat_template.py render MODEL_DIR MESSAGES.json      -> the rendered text on stdout
  kf_chat_template.py serve MODEL_DIR                     -> one JSON line per JSON line on stdin:
        {"messages": [...]} -> {"text": "..."} or {"error": "..."}
Each command takes --vars JSON before MODEL_DIR: more variables for the template (for example
{"enable_thinking": false}), as keyword arguments of apply_chat_template.
Exit: 0 ok, 1 template error (message on stderr), 2 usage.
"""
import json
import os
import secrets
import sys
from datetime import datetime

# The named special tokens transformers passes to every template (its
# SPECIAL_TOKENS_ATTRIBUTES); only those set to a non-null value are defined.
SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class TemplateFailure(Exception):
    pass


class ContentDependent(TemplateFailure):
    """The template transforms or branches on the text: renderable, but not by a layout."""


def _token_text(v):
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def load(model_dir):
    """(template text, where it came from, special-token kwargs) of a model folder.

    As transformers: chat_template.jinja beside tokenizer_config.json wins over the config's
    chat_template; a list of named templates picks "default".
    """
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    cfg = {}
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            try:
                cfg = json.load(f)
            except json.JSONDecodeError as e:
                raise TemplateFailure(f"{cfg_path}: not valid JSON: {e}")
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            text, source = f.read(), jinja_path
    else:
        t = cfg.get("chat_template")
        source = cfg_path + ": field 'chat_template'"
        if t is None:
            raise TemplateFailure(f"{model_dir}: no chat template (neither chat_template.jinja nor "
                                  f"tokenizer_config.json field 'chat_template')")
        if isinstance(t, list):
            named = {e.get("name"): e.get("template") for e in t if isinstance(e, dict)}
            if "default" not in named:
                raise TemplateFailure(f"{source}: a list of templates without one named 'default' "
                                      f"(names: {sorted(k for k in named if k)})")
            t = named["default"]
            source += " (the one named 'default')"
        if not isinstance(t, str):
            raise TemplateFailure(f"{source}: must be a string or a list of {{name, template}}")
        text = t
    special = {}
    stm_path = os.path.join(model_dir, "special_tokens_map.json")
    stm = {}
    if os.path.exists(stm_path):
        with open(stm_path, encoding="utf-8") as f:
            try:
                stm = json.load(f)
            except json.JSONDecodeError:
                stm = {}
    for k in SPECIAL_TOKENS:
        v = _token_text(cfg.get(k)) if k in cfg else _token_text(stm.get(k))
        if v is not None:
            special[k] = v
    return text, source, special


def compile_template(text):
    """The environment transformers builds (utils/chat_template_utils.py)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        # transformers' AssistantTracker parses {% generation %}...{% endgeneration %}; when
        # no assistant mask is asked for it renders the body unchanged.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(text)


def render(compiled, special, messages, extra=None):
    import jinja2
    kwargs = dict(special)
    kwargs.update(extra or {})
    try:
        return compiled.render(messages=messages, tools=None, documents=None, add_generation_prompt=True, **kwargs)
    except jinja2.exceptions.TemplateError as e:
        raise TemplateFailure(f"the template raised: {e}")


# --- layout -------------------------------------------------------------------------------

def _splice(layout, contents):
    """What the C++ side computes (ChatTemplate::render): pieces joined around contents."""
    out = [layout["pieces"][0]]
    for k, slot in enumerate(layout["slots"]):
        c = contents[slot]
        if layout["lstrip"][k]:
            c = c.lstrip()
        if layout["rstrip"][k]:
            c = c.rstrip()
        out.append(c)
        out.append(layout["pieces"][k + 1])
    return "".join(out)


def _split(text, sentinels):
    """Pieces and slot indices of a rendering made with the sentinels as contents."""
    pieces, slots, pos = [], [], 0
    while True:
        best = None
        for i, s in enumerate(sentinels):
            j = text.find(s, pos)
            if j >= 0 and (best is None or j < best[0]):
                best = (j, i)
        if best is None:
            pieces.append(text[pos:])
            return pieces, slots
        j, i = best
        pieces.append(text[pos:j])
        slots.append(i)
        pos = j + len(sentinels[i])


PAD = " \n\t\u3000"


def _probes(n):
    """Content sets that a content-transparent template renders like the layout does."""
    singles = [
        "hello",
        "  padded both ends \n\n",
        "\n\tindented first line\nsecond line  ",
        "{{ not_a_variable }} {% if x %}y{% endif %} {# c #}",
        "<|im_start|>user\n<|im_end|><|eot_id|></s><s>[INST]",
        "before</think>after",
        "<think>\nreasoning\n</think>\n\nanswer",
        "\u3000Unicode spaces\u00a0\u2003 \u00fc\u00f1\u00ef\u00e7\u00f8d\u00e9 \u4e2d\u6587 \u2713\u3000",
        "tool_calls role content system user assistant",
        "x",
        "   ",
    ]
    sets = [[p] * n for p in singles]
    sets.append([f"message {i}: {singles[i % len(singles)]}" for i in range(n)])
    sets.append([("  " if i % 2 else "") + f"m{i}" + ("\n" if i % 3 else "") for i in range(n)])
    return sets


def layout(model_dir, roles, extra=None):
    text, source, special = load(model_dir)
    try:
        compiled = compile_template(text)
    except Exception as e:  # jinja2.TemplateSyntaxError and friends
        raise TemplateFailure(f"{source}: does not compile: {e}")
    n = len(roles)
    nonce = secrets.token_hex(6)
    sentinels = [f"KFSLOT{i}Q{nonce}Z" for i in range(n)]
    if "KFSLOT" in text:
        raise TemplateFailure(f"{source}: contains the sentinel prefix KFSLOT; cannot lay it out")

    def msgs(contents):
        return [{"role": r, "content": c} for r, c in zip(roles, contents)]

    try:
        base = render(compiled, special, extra=extra, messages=msgs(sentinels))
    except TemplateFailure as e:
        raise TemplateFailure(f"{source}: roles {roles}: {e}")
    pieces, slots = _split(base, sentinels)
    # Whitespace around a content: kept, or trimmed (| trim, lstrip, rstrip), per occurrence.
    padded = [PAD + s + PAD for s in sentinels]
    lstrip, rstrip = [], []
    try:
        ptext = render(compiled, special, extra=extra, messages=msgs(padded))
    except TemplateFailure as e:
        raise TemplateFailure(f"{source}: roles {roles}: padded contents: {e}")
    ppieces, pslots = _split(ptext, sentinels)
    if pslots != slots:
        raise ContentDependent(f"{source}: roles {roles}: where the contents land depends on their "
                              f"whitespace; the sentinel method cannot render this template exactly")
    for k in range(len(slots)):
        before, after = ppieces[k], ppieces[k + 1]
        lstrip.append(not before.endswith(PAD))
        rstrip.append(not after.startswith(PAD))
    lay = {"pieces": pieces, "slots": slots, "lstrip": lstrip, "rstrip": rstrip, "roles": list(roles),
           "source": source, "empty_ok": [True] * n}
    for probe in _probes(n):
        want = render(compiled, special, extra=extra, messages=msgs(probe))
        got = _splice(lay, probe)
        if want != got:
            raise ContentDependent(
                f"{source}: roles {roles}: the output depends on the message text beyond placing "
                f"(and trimming) it (probe {probe!r}); the sentinel method cannot render this "
                f"template exactly")
    # Empty contents, one slot at a time: a template may branch on `if message.content`.
    for i in range(n):
        probe = [f"content {j}" for j in range(n)]
        probe[i] = ""
        try:
            want = render(compiled, special, extra=extra, messages=msgs(probe))
        except TemplateFailure:
            lay["empty_ok"][i] = False
            continue
        if want != _splice(lay, probe):
            lay["empty_ok"][i] = False
    return lay


def serve(model_dir, extra):
    """Renders one conversation per input line until stdin closes (ChatTemplate's exact path)."""
    text, source, special = load(model_dir)
    try:
        compiled = compile_template(text)
    except Exception as e:
        raise TemplateFailure(f"{source}: does not compile: {e}")
    for line in sys.stdin:
        try:
            messages = json.loads(line)["messages"]
            out = {"text": render(compiled, special, messages, extra)}
        except TemplateFailure as e:
            out = {"error": f"{source}: {e}"}
        except (ValueError, KeyError, TypeError) as e:
            out = {"error": f"{source}: a bad request ({e})"}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    return 0


def main(argv):
    extra = {}
    if len(argv) >= 2 and argv[1] == "--vars":
        try:
            extra = json.loads(argv[2]) if len(argv) > 2 else None
        except ValueError as e:
            print(f"--vars: not JSON ({e})", file=sys.stderr)
            return 2
        if not isinstance(extra, dict):
            print("--vars: must be a JSON object", file=sys.stderr)
            return 2
        argv = argv[:1] + argv[3:]
    if len(argv) < 2 or argv[0] not in ("layout", "render", "serve") or (argv[0] != "serve" and len(argv) < 3):
        print(__doc__.split("Usage:")[1].split("Exit:")[0].rstrip(), file=sys.stderr)
        return 2
    try:
        if argv[0] == "serve":
            return serve(argv[1], extra)
        if argv[0] == "layout":
            try:
                lay = layout(argv[1], argv[2:], extra)
            except ContentDependent as e:
                lay = {"exact": True, "reason": str(e), "roles": argv[2:]}
            print(json.dumps(lay, ensure_ascii=False))
            return 0
        if len(argv) != 3:
            print("render MODEL_DIR MESSAGES.json", file=sys.stderr)
            return 2
        with open(argv[2], encoding="utf-8") as f:
            messages = json.load(f)
        text, source, special = load(argv[1])
        sys.stdout.write(render(compile_template(text), special, messages, extra))
        return 0
    except TemplateFailure as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
