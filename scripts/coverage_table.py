"""docs/converting.md's list of the MoE architectures each server's registry holds that no
family file names, generated from fi_convert/servers/<name>/coverage.json (facts read from each
server release's own registry; tests/test_<name>_coverage.py holds them to it) and the family
files: per server, how many architectures build MoE layers, how many families cover, and each
of the others with its kind and reason.

    python scripts/coverage_table.py           # rewrite the list in docs/converting.md
    python scripts/coverage_table.py --check   # exit 1 where the doc differs (a test runs it)
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from fi_convert.servers import TARGETS
from fi_convert.servers.coverage import KINDS, coverage

DOC = Path(__file__).resolve().parents[1] / "docs" / "converting.md"
BEGIN, END = "<!-- coverage:begin (scripts/coverage_table.py) -->", "<!-- coverage:end -->"
LABEL = {"vllm": "vLLM", "sglang": "SGLang"}


def section(server: str) -> str:
    cov = coverage(server)
    kinds = Counter(e.kind for e in cov.uncovered.values())
    counts = ", ".join(f"{kind} {kinds[kind]}" for kind in KINDS if kinds[kind])
    lines = [
        f"**{LABEL.get(server, server)} {cov.release}** (`{cov.registry}`; an architecture "
        f"builds MoE layers where {cov.rule}): {len(cov.moe_architectures)} architectures "
        f"build MoE layers; families cover {len(cov.covered())}; the other "
        f"{len(cov.uncovered)}: {counts}.",
        "",
        "| architecture | kind | why |",
        "|---|---|---|",
    ]
    for kind in KINDS:
        for arch, e in sorted(cov.uncovered.items()):
            if e.kind == kind:
                lines.append(f"| `{arch}` | {kind} | {e.reason.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def table() -> str:
    kinds = "\n".join(f"- {kind}: {why}." for kind, why in KINDS.items())
    return kinds + "\n\n" + "\n".join(section(s) for s in TARGETS)


def rewritten(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table() + text[end:]


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = rewritten(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the architectures list is out of date; run scripts/coverage_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
