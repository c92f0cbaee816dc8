"""Write the generated option tables of docs/options.md (between its `options:begin` and `options:end` markers)
from the options' declarations: `python scripts/make_options_doc.py`. `tests/test_options.py` fails when the page
is not current."""

from __future__ import annotations

import re
from pathlib import Path

from trl_rm_env.recipes.reference import options_reference

PAGE = Path(__file__).resolve().parent.parent / "docs" / "options.md"
BLOCK = re.compile(r"(<!-- options:begin -->\n).*?(<!-- options:end -->)", re.S)


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    new = BLOCK.sub(lambda m: m.group(1) + options_reference() + m.group(2), text)
    PAGE.write_text(new, encoding="utf-8")
    print(f"{PAGE}: {'updated' if new != text else 'already current'}")


if __name__ == "__main__":
    main()
