#!/usr/bin/env python3
"""Checks that every relative link in the repository's Markdown files resolves.

A link `[text](path)` or `[text](path#anchor)` must name an existing file or directory
(relative to the Markdown file); an anchor into a Markdown file must match one of its headings
(GitHub's slugs: lower case, punctuation dropped, spaces as hyphens, `-1`, `-2` for repeats) or
an explicit `<a id="...">`. Links to other schemes (https:, mailto:) are not fetched. Links in
fenced code blocks and inline code are ignored.

    scripts/check-links.py [FILE.md ...]     default: every tracked *.md outside fuzz/ and target/

Exit status 1 with one line per broken link, 0 when all resolve.
"""

import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def prose_lines(text):
    """The lines of `text` outside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    """Every anchor a Markdown file defines."""
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found, seen = set(), {}
        for _, line in prose_lines(text):
            found.update(EXPLICIT_ANCHOR.findall(line))
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def broken_links(path):
    """(line number, link, why) for every link of `path` that does not resolve."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # https:, mailto:, ...
            file_part, _, anchor = target.partition("#")
            resolved = (
                os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if file_part
                else path
            )
            if not os.path.exists(resolved):
                yield number, target, f"{resolved} does not exist"
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                yield number, target, f"no heading or anchor #{anchor} in {resolved}"


def markdown_files():
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [p for p in tracked if not p.startswith(("fuzz/", "target/")) and os.path.exists(p)]


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = sys.argv[1:] or markdown_files()
    failures = 0
    for path in files:
        for number, target, why in broken_links(path):
            print(f"{path}:{number}: broken link ({target}): {why}")
            failures += 1
    print(f"checked links in {len(files)} Markdown files: {failures} broken", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
