#!/usr/bin/env python3
"""The layout rules of docs/layout.md and docs/architecture.md: a facade is a contract.

Each component publishes one header, its facade (<comp>/include/kf/<comp>/<comp>.h;
launch/: kf/launch/launcher.h; evaluator/ also kf/kernel.h, the candidates' kernel ABI).
A facade holds what OTHER folders call; everything else lives in <comp>/src/. Rules:

  facade-size     a facade is at most 20 KB (20,480 bytes). common/'s one-concern headers
                  are held to the same bound.
  unused-type     a public type (class, struct, union or enum with a body, declared at
                  namespace scope in a facade) that no other folder uses fails. "Other
                  folder" means any file outside <comp>/ and outside <comp>'s own tests and
                  benchmarks (tests/<comp>/, bench/<comp>[_<what>]/): a type that only its own
                  folder and its own tests use belongs in <comp>/src/ (tests of internals add
                  <comp>/src to their include path). Tests of OTHER folders count as users.
                  A use is a qualified name (`replay::Claim`, `using kf::replay::Claim`), or
                  the bare name in a file that opens the namespace (`namespace kf::replay {`,
                  `using namespace kf::replay`); for types of namespace kf itself (kf/kernel.h),
                  the bare name anywhere. An enumerator of an unscoped enum counts as a use of
                  its enum. A type that another folder reaches only through a used type or a
                  used function of the same facade (a field's type, a parameter, a return type)
                  is used too (the closure over the facade's declarations).
                  Exempt: common/ and bench/ (support headers, not components), launch/ and
                  stages/ (programs at the top of the graph that no other folder links: their
                  facade serves their own tools and tests).
  raw             `.raw()` (replay's raw queue-slot protocol) in a .cpp outside replay/ and its
                  own tests and benchmarks (tests/replay/, bench/replay/): use the work seam of kf/replay/replay.h instead.
  netqueue-define KF_HAVE_<NETQUEUE> (one word) in code or CMake outside netqueue/, transport/ and their
                  tests: only the transport factory (kf/transport/transport.h) knows whether
                  the network transport was built.
  cmake-foreign   a CMake file sets properties, definitions, include folders, sources or link
                  libraries on a target defined in another folder (target_*, set_target_properties,
                  set_property(TARGET ..), add_dependencies), or sets properties on source files
                  of another folder (set_source_files_properties, set_property(SOURCE ..)).
                  A folder is a top-level folder, or tests/<x>/, or bench/<x>/.
  one-facade      <comp>/include/kf/<comp>/ holds the facade and nothing else; no file outside
                  <comp>/, tests/<comp>/ and bench/<comp>[_*]/ includes another kf/<comp>/ header
                  or reaches into <comp>/src/ (relative #include or a CMake include folder).
                  common/ is exempt (it has no facade: each header is one concern).

Exit 0 when the tree follows the rules; else 1 with one line per violation
("file:line: [rule] what; what to do"), then a count per rule. --self-test checks instead that
each rule fires on a small synthetic tree with one violation of it, and not on a clean one
(CTest runs both: LayoutSelfTest, LayoutTest).

usage: check_layout.py [--root DIR] | --self-test
"""
import os
import re
import sys
import tempfile

FACADE_LIMIT = 20 * 1024
# Facades whose name is not <comp>.h; None: no single facade (see above).
FACADE_NAME = {"launch": "launcher.h", "bench": "util.h", "common": None}
# Facades outside kf/<comp>/: (component, path relative to the component folder).
EXTRA_FACADES = {"evaluator": ["include/kf/kernel.h"]}
# No type rule: common/ and bench/ (support headers, not components); launch/ and stages/,
# the programs at the top of the graph: no other folder links them, so their facade is what
# their own tools and tests drive, not a contract with other folders.
NO_TYPE_RULE = {"common", "bench", "launch", "stages"}
RAW_HOME = "replay"
NETQUEUE_HOMES = {"netqueue", "transport"}
# The define, spelt in two halves so that `grep -rn` for it finds only its two homes.
NETQUEUE_DEFINE = "KF_HAVE_" + "NETQUEUE"


# Files whose point is to read another component's internals, each with its reason. Nothing
# else outside a component may see its src/.
INTERNAL_READERS = {
    ("bench/netqueue/", "replay"): "measures the Redis queue beside the shared-memory queue (replay/src/queue.h) "
                                   "it stands in for between nodes, in one run",
}


def internal_reader(path, comp):
    return any(path.startswith(prefix) and comp == c for (prefix, c) in INTERNAL_READERS)
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
USER_EXT = SOURCE_EXT + (".py",)
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SKIP_DIRS = {"build", "third_party", "node_modules", "__pycache__", "runs"}
# Commands that change a target (its first argument) or, for the SOURCE forms, source files.
TARGET_CMDS = {"target_compile_definitions", "target_compile_options", "target_include_directories",
               "target_link_libraries", "target_link_options", "target_link_directories",
               "target_sources", "target_precompile_headers", "target_compile_features",
               "add_dependencies"}
DEFINE_CMDS = {"add_library", "add_executable", "add_custom_target", "kf_add_test"}


def components(root):
    """{comp: facade file name or None} for every <comp>/include/kf/<comp>/ folder."""
    out = {}
    for comp in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, comp, "include", "kf", comp)):
            out[comp] = FACADE_NAME.get(comp, comp + ".h")
    return out


def facades(root, comps):
    """[(comp, path relative to root)] of every facade header (common/: each header)."""
    out = []
    for comp, name in comps.items():
        if name is None:
            folder = os.path.join(comp, "include", "kf", comp)
            out += [(comp, os.path.join(folder, f)) for f in sorted(os.listdir(os.path.join(root, folder)))
                    if f.endswith(".h")]
            continue
        out.append((comp, os.path.join(comp, "include", "kf", comp, name)))
        for extra in EXTRA_FACADES.get(comp, []):
            out.append((comp, os.path.join(comp, extra)))
    return [(c, p) for c, p in out if os.path.isfile(os.path.join(root, p))]


def walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(".") and d not in SKIP_DIRS and not (rel == "." and d.startswith("build")))
        for f in sorted(filenames):
            yield os.path.normpath(os.path.join(rel, f))


def owner(path, comps=()):
    """The component a file belongs to: its top folder; X for tests/X/...; X for a
    benchmark of X (bench/X/... or bench/X_<what>/...), which, like a test, may measure
    the component's private pieces."""
    parts = path.split(os.sep)
    if parts[0] == "tests" and len(parts) > 2:
        return parts[1]
    if parts[0] == "bench" and len(parts) > 2:
        for comp in comps:
            if parts[1] == comp or parts[1].startswith(comp + "_"):
                return comp
    return parts[0]


def cmake_folder(path):
    """The folder a CMake file speaks for: tests/<x>/ and bench/<x>/ are folders of their own."""
    parts = path.split(os.sep)
    if parts[0] in ("tests", "bench") and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def read(root, path):
    try:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


# ---------------------------------------------------------------- C++ facades: declarations

def strip_cpp(text):
    """Comments, string/char literals and preprocessor lines blanked, newlines kept (so
    offsets map to the same lines)."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c in "\"'":
            if c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"d( ... )d"
                k = text.find("(", i)
                delim = ")" + text[i + 1:k] + '"'
                j = text.find(delim, k)
                j = n if j < 0 else j + len(delim)
            else:
                j = i + 1
                while j < n and text[j] != c and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j = min(j + 1, n)
            out.append(c + "".join(ch if ch == "\n" else " " for ch in text[i + 1:j - 1]) + (c if j - i > 1 else ""))
            i = j
            continue
        if c == "\n":
            at_line_start = True
        out.append(c)
        i += 1
    return "".join(out)


TYPE_HEAD = re.compile(r"\b(class|struct|union|enum(?:\s+class|\s+struct)?)\s+(?:alignas\s*\([^)]*\)\s*)?"
                       r"(?:\[\[[^\]]*\]\]\s*)?([A-Za-z_]\w*)\s*(?:final\s*)?(?::[^;{}()]*)?\{")
NAMESPACE_HEAD = re.compile(r"\b(?:inline\s+)?namespace\s*([A-Za-z_][\w:]*)?\s*\{")
EXTERN_C = re.compile(r"\bextern\s*\"\s*\"\s*\{")
WORD = re.compile(r"[A-Za-z_]\w*")
QUALIFIED = re.compile(r"(?=\b([A-Za-z_]\w*)\s*::\s*([A-Za-z_]\w*))")  # overlapping: a::b::c gives (a,b), (b,c)


def match_brace(s, i):
    """Index just past the brace that closes the one at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def declarations(text):
    """The namespace-scope declarations of a header:
    types: [(name, namespace, line, body, enumerators or None, scoped enum?)];
    others: [(names, text)] for functions, aliases and variables at namespace scope."""
    s = strip_cpp(text)
    types, others = [], []

    def scan(lo, hi, ns):
        i, start = lo, lo
        while i < hi:
            m_ns = NAMESPACE_HEAD.match(s, i) if s[i] == "n" or s[i] == "i" else None
            if m_ns and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] == "_")):
                end = match_brace(s, m_ns.end() - 1)
                name = m_ns.group(1) or ""
                scan(m_ns.end(), end - 1, ns + ([p for p in name.split("::") if p] or ["(anonymous)"]))
                i = start = end
                continue
            m_ex = EXTERN_C.match(s, i) if s[i] == "e" else None
            if m_ex:
                end = match_brace(s, m_ex.end() - 1)
                scan(m_ex.end(), end - 1, ns)
                i = start = end
                continue
            if s[i] == "{":
                head = s[start:i]
                end = match_brace(s, i)
                m = TYPE_HEAD.search(s, start, i + 1)
                if m and m.end() == i + 1 and "(" not in head[:m.start() - start]:
                    kind, name = m.group(1), m.group(2)
                    body = s[i:end]
                    enumerators, scoped = None, False
                    if kind.startswith("enum"):
                        scoped = kind != "enum"
                        enumerators = [e.split("=")[0].strip() for e in body[1:-1].split(",")]
                        enumerators = [e for e in enumerators if WORD.fullmatch(e)]
                    line = s.count("\n", 0, m.start(2)) + 1
                    types.append((name, ns, line, head + body, enumerators, scoped))
                else:
                    others.append((WORD.findall(head), head + s[i:end]))
                j = end
                while j < hi and s[j] in " \t\n":
                    j += 1
                if j < hi and s[j] == ";":
                    j += 1
                i = start = j
                continue
            if s[i] == ";":
                stmt = s[start:i]
                if stmt.strip() and not re.match(r"\s*(class|struct|union|enum)\b[^{(]*$", stmt):
                    others.append((WORD.findall(stmt), stmt))
                i = start = i + 1
                continue
            i += 1

    scan(0, len(s), [])
    return types, others


def file_uses(text):
    """(qualified pairs {(ns_segment, name)}, words, namespaces the file opens or imports)."""
    s = strip_cpp(text) if text else ""
    pairs = set(re.findall(QUALIFIED, s))
    words = set(WORD.findall(s))
    opened = set()
    for m in re.finditer(r"\bnamespace\s+([\w:]+)\s*\{", s):
        opened.add(m.group(1))
    for m in re.finditer(r"\busing\s+namespace\s+([\w:]+)\s*;", s):
        opened.add(m.group(1).lstrip(":"))
    return pairs, words, opened


def unused_types(root, comps, all_paths, problems):
    """The unused-type rule (see the module comment)."""
    users = {}
    for path in all_paths:
        if path.endswith(USER_EXT):
            text = read(root, path)
            if text is not None:
                users[path] = (owner(path, comps), file_uses(text) if not path.endswith(".py")
                               else (set(re.findall(QUALIFIED, text)), set(WORD.findall(text)), set()))
    for comp, facade in facades(root, comps):
        if comp in NO_TYPE_RULE:
            continue
        text = read(root, facade)
        if text is None:
            continue
        types, others = declarations(text)
        own = {t[0] for t in types}
        outside = [u for p, (o, u) in users.items() if o != comp]

        def used_outside(name, ns, extra_names=()):
            if not ns or ns[0] != "kf":
                return True  # std:: specializations and the like are not the facade's types
            seg = ns[-1]
            full = "::".join(ns)
            for pairs, words, opened in outside:
                names = (name,) + tuple(extra_names)
                if len(ns) == 1:  # namespace kf itself: every kf:: file sees the bare name
                    if any(n in words for n in names):
                        return True
                    continue
                if any((seg, n) in pairs for n in names):
                    return True
                if any(o == full or o.startswith(full + "::") for o in opened) and any(n in words for n in names):
                    return True
            return False

        used = set()
        for name, ns, line, body, enumerators, scoped in types:
            extra = enumerators if enumerators and not scoped else ()
            if used_outside(name, ns, extra):
                used.add(name)
        # Functions, aliases and variables of the facade that other folders call or name: the
        # types in their declarations are used. ns of a declaration: the facade's main one.
        main_ns = next((t[1] for t in types if t[1] and t[1][0] == "kf"), ["kf", comp])
        for words, decl in others:
            names = []  # what the declaration introduces: a function, an alias or a variable
            m = re.search(r"([A-Za-z_]\w*)\s*\(", decl)
            alias = re.match(r"\s*using\s+([A-Za-z_]\w*)\s*=", decl)
            var = re.search(r"([A-Za-z_]\w*)\s*(?:=|\[|$)", decl.split("(")[0]) if not m else None
            for cand in filter(None, [m and m.group(1), alias and alias.group(1), var and var.group(1)]):
                names.append(cand)
            holder = re.match(r"\s*TORCH_MODULE\s*\(\s*(\w+)\s*\)", decl)  # X holds XImpl
            if holder:
                names, decl = [holder.group(1)], decl + " " + holder.group(1) + "Impl"
            if any(used_outside(n, main_ns) for n in names):
                used.update(w for w in WORD.findall(decl) if w in own)
        # The closure: a type named in the body of a used type is used (a member `Backbone
        # backbone` names BackboneImpl through its TORCH_MODULE holder).
        bodies = {t[0]: t[3] for t in types}
        holders = {h: h + "Impl" for _, decl in others
                   for h in re.findall(r"^\s*TORCH_MODULE\s*\(\s*(\w+)\s*\)", decl) if h + "Impl" in own}
        frontier = list(used)
        while frontier:
            name = frontier.pop()
            for w in set(WORD.findall(bodies.get(name, ""))):
                w = holders.get(w, w)
                if w in own and w not in used:
                    used.add(w)
                    frontier.append(w)
        for name, ns, line, body, enumerators, scoped in types:
            if name not in used:
                problems.append(("unused-type", f"{facade}:{line}: public type {'::'.join(ns + [name])} is used by "
                                 f"no other folder (only {comp}/ and its tests); move it to a {comp}/src/*.h "
                                 f"header (tests add {comp}/src as a PRIVATE include folder)"))


# ---------------------------------------------------------------- CMake

def cmake_commands(text):
    """[(line, command name lower-cased, [arguments])] of a CMake file."""
    lines = []
    for line in text.split("\n"):  # drop comments: a '#' outside a quoted argument
        quoted = False
        for k, c in enumerate(line):
            if c == '"' and (k == 0 or line[k - 1] != "\\"):
                quoted = not quoted
            elif c == "#" and not quoted:
                line = line[:k]
                break
        lines.append(line)
    s = "\n".join(lines)
    out = []
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", s):
        i, depth, quoted = m.end(), 1, False
        while i < len(s) and depth:
            c = s[i]
            if c == '"' and s[i - 1] != "\\":
                quoted = not quoted
            elif not quoted and c == "(":
                depth += 1
            elif not quoted and c == ")":
                depth -= 1
            i += 1
        args = re.findall(r'"(?:[^"\\]|\\.)*"|[^\s()]+', s[m.end():i - 1])
        out.append((s.count("\n", 0, m.start()) + 1, m.group(1).lower(), args))
    return out


def cmake_rules(root, all_paths, problems):
    files = [p for p in all_paths if os.path.basename(p) == "CMakeLists.txt" or p.endswith(".cmake")]
    parsed = {p: cmake_commands(read(root, p) or "") for p in files}
    defined = {}
    for path, cmds in parsed.items():
        for line, cmd, args in cmds:
            if cmd in DEFINE_CMDS and args and "${" not in args[0]:
                defined.setdefault(args[0], cmake_folder(path))
    for path, cmds in parsed.items():
        mine = cmake_folder(path)
        here = os.path.dirname(path)
        for line, cmd, args in cmds:
            targets = []
            if cmd in TARGET_CMDS and args:
                targets = [args[0]]
            elif cmd == "set_target_properties":
                targets = args[:args.index("PROPERTIES")] if "PROPERTIES" in args else args
            elif cmd == "set_property" and args and args[0] == "TARGET":
                targets = []
                for a in args[1:]:
                    if a in ("PROPERTY", "APPEND", "APPEND_STRING"):
                        break
                    targets.append(a)
            for t in targets:
                if t in defined and defined[t] != mine:
                    problems.append(("cmake-foreign", f"{path}:{line}: {cmd} on {t}, a target of {defined[t]}/; "
                                     f"set it in {defined[t]}/CMakeLists.txt (or give {mine}/'s own library the "
                                     f"setting and link it)"))
            sources = []
            if cmd == "set_source_files_properties":
                for a in args:
                    if a in ("PROPERTIES", "DIRECTORY", "TARGET_DIRECTORY"):
                        break
                    sources.append(a)
            elif cmd == "set_property" and args and args[0] == "SOURCE":
                for a in args[1:]:
                    if a in ("PROPERTY", "APPEND", "APPEND_STRING", "DIRECTORY", "TARGET_DIRECTORY"):
                        break
                    sources.append(a)
            if cmd in ("set_source_files_properties", "set_property") and "TARGET_DIRECTORY" in args:
                k = args.index("TARGET_DIRECTORY")
                for t in args[k + 1:]:
                    if t == "PROPERTIES" or t == "PROPERTY":
                        break
                    if t in defined and defined[t] != mine:
                        problems.append(("cmake-foreign", f"{path}:{line}: {cmd} ... TARGET_DIRECTORY {t}: sets "
                                         f"source properties in {defined[t]}/'s directory; do it in "
                                         f"{defined[t]}/CMakeLists.txt"))
            for src in sources:
                rel = src.strip('"')
                rel = rel.replace("${CMAKE_SOURCE_DIR}/", "").replace("${PROJECT_SOURCE_DIR}/", "")
                if rel == src.strip('"'):
                    rel = os.path.normpath(os.path.join(here, rel.replace("${CMAKE_CURRENT_SOURCE_DIR}/", "")))
                if "${" in rel or rel.startswith(".."):
                    continue
                theirs = cmake_folder(rel) if len(rel.split(os.sep)) > 1 else mine
                if theirs != mine:
                    problems.append(("cmake-foreign", f"{path}:{line}: {cmd} on {rel}, a source file of {theirs}/; "
                                     f"set its properties in {theirs}/CMakeLists.txt"))


# ---------------------------------------------------------------- the check

def check(root):
    """[(rule, message)] for every violation under root."""
    comps = components(root)
    problems = []
    all_paths = list(walk(root))

    for comp, facade in comps.items():  # one-facade: the public folder holds the facade only
        if facade is None:
            continue
        folder = os.path.join(root, comp, "include", "kf", comp)
        for name in sorted(os.listdir(folder)):
            if name != facade:
                problems.append(("one-facade", f"{comp}/include/kf/{comp}/{name}: only the facade kf/{comp}/{facade} "
                                 f"may be public; move it to {comp}/src/ (or put what others need in the facade)"))
        if not os.path.isfile(os.path.join(folder, facade)):
            problems.append(("one-facade", f"{comp}/include/kf/{comp}/: the facade {facade} is missing"))

    for comp, facade in facades(root, comps):  # facade-size
        size = os.path.getsize(os.path.join(root, facade))
        if size > FACADE_LIMIT:
            problems.append(("facade-size", f"{facade}:1: {size / 1024:.1f} KB, over the {FACADE_LIMIT // 1024} KB "
                             f"bound of a facade; keep in it what other folders use and move the rest to "
                             f"{comp}/src/*.h headers"))

    unused_types(root, comps, all_paths, problems)
    cmake_rules(root, all_paths, problems)

    for path in all_paths:
        mine = owner(path, comps)
        is_cmake = os.path.basename(path) == "CMakeLists.txt" or path.endswith(".cmake")
        if not (path.endswith(SOURCE_EXT) or is_cmake):
            continue
        text = read(root, path)
        if text is None:
            continue
        lines = text.split("\n")
        for n, line in enumerate(lines, 1):
            if NETQUEUE_DEFINE in line and mine not in NETQUEUE_HOMES:
                problems.append(("netqueue-define", f"{path}:{n}: {NETQUEUE_DEFINE} outside netqueue/ and transport/; "
                                 f"open the transport through kf/transport/transport.h (its factory knows "
                                 f"whether the network transport was built)"))
            if path.endswith(".cpp") and ".raw()" in line and mine != RAW_HOME:
                problems.append(("raw", f"{path}:{n}: .raw() reaches into replay's queue-slot protocol; use the "
                                 f"work seam of kf/replay/replay.h (CandidateSource, GroupSink, ReadyGroups) or "
                                 f"a replay/ function for what it does"))
            if is_cmake:
                if "include_directories" in line or "INCLUDE_DIRECTORIES" in line:
                    for comp in re.findall(r"\$\{CMAKE_SOURCE_DIR\}/([A-Za-z_]+)/src\b", line):
                        if comp in comps and comp != mine and not internal_reader(path, comp):
                            problems.append(("one-facade", f"{path}:{n}: adds {comp}/src to an include path; "
                                             f"outside {comp}/ only its facade may be used"))
                continue
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            parts = inc.split("/")
            if len(parts) >= 3 and parts[0] == "kf" and parts[1] in comps and parts[1] != mine:
                facade = comps[parts[1]]
                if facade is not None and "/".join(parts[2:]) != facade:
                    problems.append(("one-facade", f"{path}:{n}: includes {inc}; outside {parts[1]}/ only "
                                     f"kf/{parts[1]}/{facade} may be included"))
            if ".." in parts:
                target = os.path.normpath(os.path.join(os.path.dirname(path), inc)).split(os.sep)
                if len(target) > 2 and target[0] in comps and target[1] == "src" and target[0] != mine:
                    problems.append(("one-facade", f"{path}:{n}: includes {inc}, a private file of {target[0]}/"))
    return problems


def self_test():
    """Each rule must fire on a tree with one violation of it; the clean tree must pass."""
    def tree(files):
        d = tempfile.mkdtemp(prefix="kf-layout-")
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        return d
    alpha_h = ("#pragma once\n#include <string>\nnamespace kf::alpha {\n"
               "struct Part { int x; };\n"                      # used through Whole's field
               "struct Whole { Part part; };\n"                 # used by beta by name
               "enum Mode : int { kModeA = 0, kModeB = 1 };\n"  # used through an enumerator
               "struct Opts { int n = 0; };\n"                  # used through open()'s parameter
               "int open(const Opts& o);\n"
               "}  // namespace kf::alpha\n")
    clean = {
        "CMakeLists.txt": "add_subdirectory(alpha)\nadd_subdirectory(beta)\n",
        "alpha/CMakeLists.txt": ("add_library(kf_alpha src/a.cpp)\n"
                                 "target_compile_definitions(kf_alpha PRIVATE A=1)\n"
                                 "set_source_files_properties(src/a.cpp PROPERTIES COMPILE_DEFINITIONS B=1)\n"),
        "alpha/include/kf/alpha/alpha.h": alpha_h,
        "alpha/src/piece.h": "#pragma once\nnamespace kf::alpha { struct Hidden {}; }\n",
        "alpha/src/a.cpp": '#include "kf/alpha/alpha.h"\n#include "piece.h"\n',
        "replay/src/r.cpp": "void f(Q& q) { q.raw(); }\n",
        "beta/CMakeLists.txt": "add_library(kf_beta src/b.cpp)\ntarget_link_libraries(kf_beta PUBLIC kf_alpha)\n",
        "beta/include/kf/beta/beta.h": ('#pragma once\n#include "kf/alpha/alpha.h"\nnamespace kf::beta {\n'
                                        "struct Job { alpha::Whole w; };\n}\n"),
        "beta/src/b.cpp": ('#include "kf/beta/beta.h"\n#include "kf/common/log.h"\n'
                           "namespace kf::beta { int g() { return alpha::open({}) + alpha::kModeB; } }\n"),
        "gamma/include/kf/gamma/gamma.h": "#pragma once\nnamespace kf::gamma { int h(); }\n",
        "gamma/src/g.cpp": "namespace kf::gamma { int h() { beta::Job j; return 0; } }\n",
        "tests/beta/CMakeLists.txt": ("kf_add_test(beta_test SOURCES b_test.cpp LIBS kf_beta)\n"
                                      "target_include_directories(beta_test PRIVATE ${CMAKE_SOURCE_DIR}/beta/src)\n"),
        "tests/beta/b_test.cpp": '#include "kf/beta/beta.h"\nkf::beta::Job j;\n',
        "tests/alpha/a_test.cpp": '#include "piece.h"\n',
        "tests/replay/r_test.cpp": "void t(Q& q) { q.raw(); }\n",
        "transport/src/t.cpp": f"#ifdef {NETQUEUE_DEFINE}\n#endif\n",
        "common/include/kf/common/log.h": "#pragma once\nnamespace kf { struct Logger {}; }\n",
        "bench/alpha_scale/CMakeLists.txt": "target_include_directories(b PRIVATE ${CMAKE_SOURCE_DIR}/alpha/src)\n",
    }
    bad = {
        "facade-size": {"gamma/include/kf/gamma/gamma.h": "#pragma once\n" + "// x\n" * 8000},
        "unused-type": {"gamma/include/kf/gamma/gamma.h": "#pragma once\nnamespace kf::gamma { struct Lonely {}; }\n",
                        "gamma/src/g.cpp": "namespace kf::gamma { Lonely l; }\n",
                        "tests/gamma/g_test.cpp": "kf::gamma::Lonely l;\n"},
        "raw": {"beta/src/c.cpp": "void f(Q& q) { q.raw().reap(); }\n"},
        "netqueue-define": {"beta/src/d.cpp": f"#ifdef {NETQUEUE_DEFINE}\n#endif\n"},
        "cmake-foreign": {"beta/CMakeLists.txt": ("add_library(kf_beta src/b.cpp)\n"
                                                  "target_compile_definitions(kf_alpha PRIVATE X=1)\n")},
        "cmake-foreign (source)": {"beta/CMakeLists.txt": (
            "add_library(kf_beta src/b.cpp)\n"
            "set_source_files_properties(${CMAKE_SOURCE_DIR}/alpha/src/a.cpp PROPERTIES COMPILE_DEFINITIONS X=1)\n")},
        "cmake-foreign (tests)": {"tests/beta/CMakeLists.txt": (
            "kf_add_test(beta_test SOURCES b_test.cpp LIBS kf_beta)\n"
            "target_compile_definitions(kf_beta PRIVATE X=1)\n")},
        "one-facade (second public header)": {"alpha/include/kf/alpha/piece.h": "#pragma once\n"},
        "one-facade (include of a non-facade header)": {"beta/src/c.cpp": '#include "kf/alpha/piece.h"\n'},
        "one-facade (relative include of src)": {"beta/src/d.cpp": '#include "../../alpha/src/piece.h"\n'},
        "one-facade (CMake include folder)":
            {"beta/CMakeLists.txt": "target_include_directories(b PRIVATE ${CMAKE_SOURCE_DIR}/alpha/src)\n"},
    }
    ok = True
    found = check(tree(clean))
    if found:
        print("self-test: the clean tree was reported:", *[m for _, m in found], sep="\n  ")
        ok = False
    for what, extra in bad.items():
        rule = what.split(" ")[0]
        found = [r for r, _ in check(tree({**clean, **extra}))]
        if rule not in found:
            print(f"self-test: not reported: {what} (got: {found or 'nothing'})")
            ok = False
    print("self-test:", "ok" if ok else "FAILED")
    return ok


def main():
    args = sys.argv[1:]
    usage = "usage: check_layout.py [--root DIR] | --self-test"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "--root" in args:
        i = args.index("--root")
        if i + 1 >= len(args):
            print(usage, file=sys.stderr)
            return 2
        root = args[i + 1]
        del args[i:i + 2]
    if "--self-test" in args:
        args.remove("--self-test")
        if args:
            print(f"check_layout.py: --self-test takes no other argument\n{usage}", file=sys.stderr)
            return 2
        return 0 if self_test() else 1
    if args:
        print(f"check_layout.py: unknown argument {args[0]}\n{usage}", file=sys.stderr)
        return 2
    problems = check(root)
    for rule, message in problems:
        print(message.replace(": ", f": [{rule}] ", 1))
    counts = {}
    for rule, _ in problems:
        counts[rule] = counts.get(rule, 0) + 1
    if problems:
        print("check_layout: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items())) +
              " (rules: tests/layout/check_layout.py; docs/layout.md)")
    else:
        print("check_layout: every facade is a contract (size, used types, no .raw(), "
              f"{NETQUEUE_DEFINE} only in netqueue/ and transport/, CMake on own targets)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
