#!/usr/bin/env python3
"""Checks every markdown link in README.md and docs/ (recursively).

    dev/check_links.py [FILE_OR_DIR ...]     (default: README.md docs)

A link is broken when its target file does not exist, when it leaves the repository, when
it points outside the repository by URL (only relative links are allowed in the user docs),
or when its #anchor names no heading of the target page (GitHub's heading slugs). Prints one
line per broken link, `FILE:LINE: [text](target): why`, then a count; exit 0 when none is
broken, 1 otherwise, 2 for a usage error (a named path that does not exist).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    out, seen, fenced = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            # inline code is not a link
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                yield no, m.group(1), m.group(2)


def check(path):
    bad = []
    here = os.path.dirname(path)
    for no, text, target in links(path):
        why = None
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            why = "a link outside the repository (use a relative path)"
        else:
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file_part)) if file_part else path
            if os.path.commonpath([ROOT, dest]) != ROOT:
                why = "leaves the repository"
            elif not os.path.exists(dest):
                why = "no such file"
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                why = f"no heading with anchor #{frag} in {os.path.relpath(dest, ROOT)}"
        if why:
            bad.append(f"{os.path.relpath(path, ROOT)}:{no}: [{text}]({target}): {why}")
    return bad


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    names = argv or ["README.md", "docs"]
    files = []
    for name in names:
        p = os.path.join(ROOT, name) if not os.path.isabs(name) else name
        if not os.path.exists(p):
            print(f"check_links: {name}: no such file or folder", file=sys.stderr)
            return 2
        if os.path.isdir(p):
            for d, _, fs in os.walk(p):
                files += [os.path.join(d, f) for f in sorted(fs) if f.endswith(".md")]
        else:
            files.append(p)
    bad, count = [], 0
    for f in sorted(files):
        count += sum(1 for _ in links(f))
        bad += check(f)
    for line in bad:
        print(line)
    print(f"check_links: {count} links in {len(files)} files, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
