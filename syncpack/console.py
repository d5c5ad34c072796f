"""The ``syncpack`` program's entry point.

Loading the command line takes a moment (click, SQLite, the store); a Ctrl-C in that moment
would otherwise end in Python's traceback.  Nothing has been done yet then, so one line and
exit 130 (128 + SIGINT, as for an interrupted command) say all there is."""

import sys

# glibc's M_MMAP_THRESHOLD: buffers at least this large are mapped on their own, and unmapped
# when freed.  M_TRIM_THRESHOLD: free memory at the heap's top kept for reuse up to this much.
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1
_OWN_MAPPING_BYTES = 4 << 20
_KEPT_AT_TOP_BYTES = _OWN_MAPPING_BYTES


def large_buffers_go_back() -> None:
    """Make freed large buffers (a block's bytes, its decompressed body) return to the system.

    glibc raises its threshold for mapping a buffer on its own each time such a buffer is
    freed; later buffers of a packet's size then come from the heap, which keeps freed memory,
    and an import's peak grew with the order of earlier allocations (a 1 GB packet: 256 MB
    against 210 MB with the threshold fixed at 4 MiB; at 1 MiB, 195 MB, but a bulk import of
    small values spent 20% more CPU mapping its many 1-4 MiB lists afresh).  Fixing it also
    fixes the threshold for giving back the free memory at the heap's top at its default,
    128 KiB, which glibc would otherwise raise beside it: every 1 MiB buffer (msgpack makes
    one per packb call) was then given back as it was freed and asked for again by the next,
    two system calls a value (an import of 30,000 merged updates made 734,000 of them, 9.7 s
    of its 14).  It is set to the mapping threshold: a free 1 MiB buffer stays for the next,
    and at most 4 MiB more than before is held at any time (an import's peak RSS stays
    within its bound).  Elsewhere, or without glibc, nothing is done."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _OWN_MAPPING_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEPT_AT_TOP_BYTES)
    except (OSError, AttributeError):
        pass


def interrupts_never_lost() -> None:
    """A Ctrl-C that lands while Python runs a finaliser (an unfinished generator closed as it
    is freed, a ``__del__``) cannot be raised there: Python prints "Exception ignored" and a
    traceback, and the interrupt is gone, so the command would go on as if never stopped.
    Such an interrupt is delivered again instead, by a thread a moment later (raised from the
    hook itself it would be dropped the same way), in the main thread at its next step, where
    the command's own handler reports it."""
    def again() -> None:
        import _thread
        import time
        time.sleep(0.01)
        _thread.interrupt_main()

    def hook(unraisable) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            import threading    # only then: a command's start does not pay for it
            threading.Thread(target=again, daemon=True).start()
            return
        sys.__unraisablehook__(unraisable)

    sys.unraisablehook = hook


def _terminated(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    try:
        # inside: its import builds enums, long enough for a Ctrl-C to land in it on a slow
        # host (a traceback and exit -2, seen)
        import signal
        # 'systemctl stop' while the command line loads: told as a Ctrl-C then is (without
        # this, SIGTERM's default action ended the process silently, exit 143)
        signal.signal(signal.SIGTERM, _terminated)
        interrupts_never_lost()
        large_buffers_go_back()
        from syncpack.cli import main as run
    except KeyboardInterrupt:
        import signal       # (imported again if the interrupt came while it was)
        # told once: a second interrupt now (another signal, or one a finaliser swallowed
        # and interrupts_never_lost delivers again) would end the process by SIGINT itself
        for n in (signal.SIGINT, signal.SIGTERM):
            signal.signal(n, signal.SIG_IGN)
        message = "interrupted while starting; nothing was done"
        args = sys.argv[1:]
        if "--json" in args[:args.index("--") if "--" in args else len(args)]:
            # --json promises one document on stdout, an error's too
            import json
            sys.stdout.write(json.dumps({"error": message, "hint": None}) + "\n")
            sys.stdout.flush()
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
        # Nothing was opened, so nothing needs the interpreter's orderly exit, which a module
        # half-imported when the interrupt came can still end by SIGINT (exit -2 seen)
        import os
        os._exit(130)
    run()
