"""Write the vLLM support table (release x scheme x backend) into docs/serving.md, from the
proven table (fi_convert/servers/vllm/releases.py), between its two marker lines.

    python scripts/support_table.py            # rewrite the table in docs/serving.md
    python scripts/support_table.py --check    # exit 1 if the page's table is not the table's

tests/test_vllm_releases.py checks that the page holds what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fi_convert.servers.vllm.releases import TABLE_BEGIN, TABLE_END, support_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def with_table(text: str) -> str:
    """The page with the text between its markers (markers included) replaced by the table."""
    start, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
    return text[:start] + support_table() + text[end:]


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    new = with_table(text)
    if argv[1:] == ["--check"]:
        if new != text:
            print(f"{PAGE}: the support table is not releases.py's; run scripts/support_table.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
