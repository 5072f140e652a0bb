"""python -m minillm.course {build,check,strip} [--root DIR] | grade SUBMISSIONS [options] | self-check NOTEBOOK"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .build import MarkerError, build, check, strip


def default_jobs() -> int:
    """Notebooks graded at once by default: each runs a kernel and a verdict process of about one
    core each, so half the cores this process may use (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


def grade_parser() -> argparse.ArgumentParser:
    from . import grade
    parser = argparse.ArgumentParser(prog="python -m minillm.course grade", description=grade.__doc__.split("\n\n")[0],
                                     epilog=grade.__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="the folder of submissions (see below)")
    parser.add_argument("--lessons", help="grade only these lessons, e.g. 03,04 (default: every one found)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--csv", type=Path, help="write one row per student, lesson and exercise")
    parser.add_argument("--json", type=Path, help='write [{"student", "lesson", "exercise", "passed", "message"}]')
    parser.add_argument("--extra-checks", help="hidden checks: a module (dotted name or .py file) of "
                                               "functions lessonNN_<name>(namespace)")
    parser.add_argument("--jobs", type=int, default=default_jobs(),
                        help=f"notebooks graded at once (default {default_jobs()}: what this machine can take)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout whose solutions/ define the lessons (default: . when it has "
                             "solutions/, else the package's own checkout)")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto",
                        help="where student code runs (minillm/course/sandbox.py): bwrap (bubblewrap), none "
                             "(unconfined, as your own user: a loud warning), auto (bwrap when it works here)")
    return parser


def self_check_parser() -> argparse.ArgumentParser:
    from . import self_check
    parser = argparse.ArgumentParser(prog="python -m minillm.course self-check",
                                     description=self_check.__doc__.split("\n\n")[0],
                                     epilog=self_check.__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path, help="your lesson notebook, e.g. lessons/03_paged_kv.ipynb")
    parser.add_argument("--lesson", help="the lesson's number, when the file's name does not start with it")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the notebook (default 600, as grade)")
    parser.add_argument("--json", type=Path, help='write [{"student", "lesson", "exercise", "passed", "message"}]')
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout whose solutions/ define the lessons (default: as grade)")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "none"], default="auto",
                        help="where the notebook runs, as grade's --sandbox (default auto)")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["self-check"]:
        from .grade import GradingError
        from .self_check import main as self_check_main
        args = self_check_parser().parse_args(argv[1:])
        try:
            return self_check_main(args)
        except (GradingError, MarkerError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if argv[:1] == ["grade"]:
        from .grade import GradingError, main as grade_main
        args = grade_parser().parse_args(argv[1:])
        try:
            return grade_main(args)
        except (GradingError, MarkerError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    parser = argparse.ArgumentParser(prog="python -m minillm.course", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "check", "strip", "grade", "self-check"],
                        help="build: write lessons/ from solutions/; check: exit 1 if they are out of "
                             "sync or a solution has outputs; strip: clear outputs from solutions/; "
                             "grade SUBMISSIONS: grade a class (grade --help); self-check NOTEBOOK: "
                             "your notebook's verdicts, as grade gives them (self-check --help)")
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
