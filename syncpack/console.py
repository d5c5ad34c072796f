"""The ``syncpack`` program's entry point.

Loading the command line takes a moment (click, SQLite, the store); a Ctrl-C in that moment
would otherwise end in Python's traceback.  Nothing has been done yet then, so one line and
exit 130 (128 + SIGINT, as for an interrupted command) say all there is."""

import sys


def main() -> None:
    try:
        from syncpack.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted while starting; nothing was done\n")
        sys.stderr.flush()
        raise SystemExit(130) from None
    run()
