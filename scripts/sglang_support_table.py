"""Write (or with --check, check) the SGLang support table of docs/sglang.md from
fi_convert/servers/sglang/releases.py, between its two markers: release x scheme/backend,
proven, other bytes, not served or refused, and why (tests/test_sglang_releases.py checks that
the page holds what this writes).

    python scripts/sglang_support_table.py          # rewrite the table in docs/sglang.md
    python scripts/sglang_support_table.py --check  # exit 1 if the page's table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from fi_convert.servers.sglang.releases import support_table
from fi_convert.servers.sglang.target import NO_FLASHINFER

PAGE = Path(__file__).resolve().parent.parent / "docs" / "sglang.md"
BEGIN = "<!-- support table: scripts/sglang_support_table.py writes it -->"
END = "<!-- end of the support table -->"


def render(page: str) -> str:
    """The page with its table between the markers made from the releases table."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{support_table(NO_FLASHINFER)}\n{END}{tail}"


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    want = render(page)
    if "--check" in argv:
        if want != page:
            print(f"{PAGE}: the support table is stale; run scripts/sglang_support_table.py")
            return 1
        return 0
    PAGE.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
