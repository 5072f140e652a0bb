"""python -m minillm.course {build,check,strip} [--root DIR]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import MarkerError, build, check, strip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.course", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "check", "strip"],
                        help="build: write lessons/ from solutions/; check: exit 1 if they are out of "
                             "sync or a solution has outputs; strip: clear outputs from solutions/")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the repository root holding solutions/ and lessons/ (default: .)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            written, removed = build(args.root)
            for path in written:
                print(f"wrote {path}")
            for path in removed:
                print(f"removed {path} (no solution notebook)")
            print("lessons/ is up to date" if not (written or removed) else
                  f"{len(written)} written, {len(removed)} removed")
        elif args.command == "strip":
            changed = strip(args.root)
            for path in changed:
                print(f"stripped {path}")
            print(f"{len(changed)} solution notebook(s) changed")
        else:
            problems = check(args.root)
            if problems:
                print("course check failed:", *problems, sep="\n  ")
                return 1
            print("course check passed: lessons/ matches solutions/, and no solution carries outputs")
    except (MarkerError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
