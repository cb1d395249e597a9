# The C extension built from _nativechild.c (see native.py).

from collections.abc import Callable
from types import CodeType
from typing import Any

ABI: int
CONTRACT: dict[str, int]
HIDES_FRAMES: int

def serve(
    *,
    control: int,
    clone_flags: int,
    spawn: bool,
    tmpfs_options: str,
    roots: list[str],
    binds: list[str],
    workdir: str,
    last_cap: int,
    nproc_headroom: int,
    vm_baseline: int,
    abi: int,
    handled_fs: int,
    handled_net: int,
    scoped: int,
    attr_size: int,
    read_only: int,
    file_only: int,
    rules: list[tuple[int, int]],
    fd_range: tuple[int, int],
    writable: list[str],
    readable: list[str],
    seccomp: bytes,
    generators: list[tuple[int, int]],
    warm: Callable[[], object] | None = None,
) -> tuple[bytes, int] | None: ...
def say_done(code: int, /) -> None: ...
def run_main(code: CodeType, globals: dict[str, Any], /) -> Any: ...
def call_bare(callable: Callable[[], object], /) -> object: ...
def arm_stand_ins(snippet: bool, /) -> int: ...
def write_state(key_address: int, position_address: int, key: bytes, /) -> None: ...
