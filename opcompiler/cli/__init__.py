"""`opcompiler` command line. Each command family lives in its own module with a
`register(subparsers)` function; exit codes: 0 success, 2 bad input or usage, 1 our failure.

Every command sees every template: the core's registry loads the shipped templates on the first
lookup (the loader `opcompiler/__init__.py` installs), so arguments are checked without TVM and
the listings, which build nothing, never import it."""
from __future__ import annotations

import argparse
import sys
from importlib import import_module

from .. import settings
from ..errors import OpcError, OpcFailure

# Command modules, in help order. Each defines register(subparsers).
COMMAND_MODULES = ("basic", "tune", "graph", "export", "build")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"opcompiler: error: {message} (see {self.prog} --help)\n")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opcompiler", description="Operator compiler and autotuner on Apache TVM.")
    from ..settings import __version__
    parser.add_argument("--version", action="version", version=f"opcompiler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            mod = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue  # that command family is not in this build
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from . import common
    parser = make_parser()
    args = parser.parse_args(argv)
    # notes (a default target, shape keys filled in) wait for the command's first output, so that
    # bad input is answered with its one-line error alone
    out, err = sys.stdout, sys.stderr
    common.drop_notes()
    common._REAL_STDERR.append(err)
    sys.stdout, sys.stderr = common.NotesFirst(out), common.NotesFirst(err)
    try:
        common.check_args(args)  # names, keys and the default target, before a command imports TVM
        rc = args.func(args)
        common.flush_notes()
        return int(rc or 0)
    except OpcError as e:
        common.drop_notes()
        print(f"opcompiler: error: {e}", file=err)
        return 2
    except OpcFailure as e:
        common.flush_notes()
        print(f"opcompiler: failure: {e}", file=err)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed: not an error of ours
        err.close()
        return 0
    except KeyboardInterrupt:
        print("opcompiler: interrupted", file=err)
        return 130
    except Exception as e:  # a bug of ours: one line unless OPC_DEBUG asks for the traceback
        common.flush_notes()
        if settings.debug():
            raise
        print(f"opcompiler: internal error: {type(e).__name__}: {e} (set OPC_DEBUG=1 for the traceback)", file=err)
        return 1
    finally:
        sys.stdout, sys.stderr = out, err
        common._REAL_STDERR.pop()


if __name__ == "__main__":
    sys.exit(main())
