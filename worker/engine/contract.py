"""The contract between the supervisor, a zygote and a child, defined once.

A child is set up by one of two implementations of the same steps: _nativechild.c (the
common case) or child.py (where no compiler was, or no PID namespace), and a snippet
ends through runtime.finish in either. Every number both sides use is here, the request
header's layout included (its format, and the offset the C side reads each field at);
the C module exports its own copies as ``_nativechild.CONTRACT`` and native.py refuses a
build whose copies differ from these (tests/worker/test_child_contract.py fails on any
difference), so a constant changed on one side by hand fails a test instead of a user.

No imports: the bare zygote's image loads this and little else.
"""

# A child's fds. REQUEST_FD is its end of the request socket (spawn mode: the source,
# once its interpreter is exec'd); DONE_FD the write end of its done pipe (done.py);
# RECORD_FD, in spawn mode, where notebook cells' records go (cells.py).
REQUEST_FD = 3
DONE_FD = 4
RECORD_FD = 5

# A child whose set-up failed before the user's first line exits with this.
SETUP_FAILED_EXIT = 126
MAX_OPEN_FILES = 256
# What a child says on its request socket once its limits are in place: anything after
# this is the user's doing.
READY = b"R"

# What the supervisor sends a waiting child: a fixed header (code bytes, inputs bytes,
# cpu_s, memory_mb, max_file_mb, max_procs, flags...), the code, and its inputs as
# msgpack when it has any (child.ChildRequest).
HEAD_FORMAT = "!IIIIIIBB"
HEAD_SIZE = 26
# Where each of its fields starts, in bytes, in HEAD_FORMAT's order ("!": big-endian, no
# padding): the Python side packs and unpacks the whole format, the C side reads each
# field by these offsets (an "I" as four bytes, a "B" as one), and the two sides' copies
# are compared like every other constant here.
HEAD_OFFSETS = {
    "HEAD_CODE_LEN": 0,
    "HEAD_EXTRA_LEN": 4,
    "HEAD_CPU_S": 8,
    "HEAD_MEMORY_MB": 12,
    "HEAD_MAX_FILE_MB": 16,
    "HEAD_MAX_PROCS": 20,
    "HEAD_AUTO_PRINT": 24,
    "HEAD_RICH_TRACEBACKS": 25,
}
FLAG_AUTO_PRINT = 1  # the flags a plain request reaches runtime.run_snippet with
FLAG_RICH_TRACEBACKS = 2

# The done notice (done.py): exit code (negative: the signal that ended it, as a
# returncode says it), DONE_MAGIC, CPU microseconds and peak RSS in KiB of the child and
# what it reaped, the last pid given out in its PID namespace (1: none but its own).
# Only the snippet's first process, its PID namespace's init, says it: whatever it
# forks may end in any way and the snippet goes on, as under ``python -c``.
DONE_FORMAT = "=iIqqi"
DONE_SIZE = 28
DONE_MAGIC = 0x454E4F44  # "DONE"
FIRST_PID = 1

# MT19937, the generator of CPython's random and numpy's legacy RandomState: words of
# state each child's reseed writes (native.generators).
MT_WORDS = 624

# Bumped whenever _nativechild's functions change what they take or return.
NATIVE_ABI = 9

# The names both sides define: what CONTRACT must hold, with these values.
SHARED = {
    "REQUEST_FD": REQUEST_FD,
    "DONE_FD": DONE_FD,
    "SETUP_FAILED_EXIT": SETUP_FAILED_EXIT,
    "MAX_OPEN_FILES": MAX_OPEN_FILES,
    "READY": READY[0],
    "HEAD_FORMAT": HEAD_FORMAT,
    "HEAD_SIZE": HEAD_SIZE,
    **HEAD_OFFSETS,
    "FLAG_AUTO_PRINT": FLAG_AUTO_PRINT,
    "FLAG_RICH_TRACEBACKS": FLAG_RICH_TRACEBACKS,
    "DONE_SIZE": DONE_SIZE,
    "DONE_MAGIC": DONE_MAGIC,
    "FIRST_PID": FIRST_PID,
    "MT_WORDS": MT_WORDS,
    "NATIVE_ABI": NATIVE_ABI,
}
