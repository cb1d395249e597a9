"""The trainer's side: submit batches, collect results, drop-in RemoteSandbox.

Portable: imports and works wherever a trainer runs (no Linux-only code here).
"""

from __future__ import annotations

from codepool.producer.pool import Batch, CodePool
from codepool.producer.sandbox import RemoteSandbox

__all__ = ["Batch", "CodePool", "RemoteSandbox"]
