"""Write or check docs/configuration.md, the configuration reference generated from rpr_mt/config.py.

    python3 scripts/config_reference.py --write docs/configuration.md    # after changing a config field or comment
    python3 scripts/config_reference.py --check docs/configuration.md    # exit 1 when the page is out of date
    python3 scripts/config_reference.py                                  # print the page

The page is rpr_mt.config_reference.render_markdown(): every section, key, type, default and the comment of its
dataclass field. tests/test_config_reference.py fails when the committed page differs from it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rpr_mt.config_reference import render_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="FILE", help="write the page to FILE (atomically)")
    group.add_argument("--check", type=Path, metavar="FILE", help="exit 1 if FILE is not the page as generated")
    args = parser.parse_args(argv)
    page = render_markdown()
    if args.check is not None:
        current = args.check.read_text(encoding="utf-8") if args.check.is_file() else None
        if current != page:
            print(f"{args.check} is out of date: run python3 scripts/config_reference.py --write {args.check}",
                  file=sys.stderr)
            return 1
        return 0
    if args.write is not None:
        tmp = args.write.with_name(f".{args.write.name}.tmp")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, args.write)  # a kill while writing leaves the previous page, never half of one
        print(f"wrote {args.write}", file=sys.stderr)
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
