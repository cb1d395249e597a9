"""Counts of lone calls that ride with their replies (worker/call_server.py).

A call server pushes its replies and, in the same round trip, one entry per run tag
with what those replies add to the counters onto its start's pending list
(``Keys.host_call_counts``): one command per reply batch, whatever the number of
fields. At most once a ``FLUSH_S`` it folds that list into the counter hashes
(``FOLD``); a janitor folds a lapsed start's list (common/janitor.py), so a host killed
-9 right after answering loses no count of what its callers got (docs/chaos.md,
finding 5).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.ledger import Script
from codepool.common.result import CANCELLED, ExecResult
from codepool.common.tally import count_hashes

# KEYS: the pending list. ARGV: [the entries to fold, a JSON array]; without it, the
# list's. Each entry: {"k": counter hashes (the minute hash second), "x": the minute
# hash's TTL, "t": {field: increment as a string}}. Sums the entries first: one HINCRBY
# per hash and field, however many replies went since the last fold. The list is
# deleted either way. A live call server passes what it pushed since its last fold: a
# primary that lost those pushes in a failover (replication is asynchronous) loses no
# count, and a reply batch pushed twice is counted once.
# -> how many entries it folded.
FOLD = """
local items
if ARGV[1] then
  items = cjson.decode(ARGV[1])
else
  items = {}
  for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    items[#items + 1] = cjson.decode(raw)
  end
end
local sums, ttls = {}, {}
for _, e in ipairs(items) do
  for _, key in ipairs(e.k) do
    local sum = sums[key] or {}
    sums[key] = sum
    for field, n in pairs(e.t) do sum[field] = (sum[field] or 0) + tonumber(n) end
  end
  ttls[e.k[2]] = e.x
end
for key, sum in pairs(sums) do
  for field, n in pairs(sum) do
    redis.call('HINCRBY', key, field, string.format('%d', n))
  end
end
for key, ttl in pairs(ttls) do redis.call('EXPIRE', key, ttl) end
redis.call('DEL', KEYS[1])
return #items
"""

fold_script = Script(FOLD)


def entries(
    keys: Keys, host: str, tallies: Iterable[tuple[str, ExecResult]], *, minute_ttl_s: int
) -> list[str]:
    """The pending-list entries for ``tallies`` (run tag, result), one per run tag."""
    by_run: dict[str, Counter[str]] = {}
    for run, result in tallies:
        tally = by_run.setdefault(run, Counter())
        if result.status == CANCELLED:
            tally[CANCELLED] += 1
        else:
            tally.update(counters.count(result))
    return [
        json.dumps(
            {
                "k": count_hashes(keys, host, run),
                "x": minute_ttl_s,
                "t": {name: str(value) for name, value in tally.items() if value},
            }
        )
        for run, tally in by_run.items()
        if any(tally.values())
    ]


def fold_args(owed: list[str]) -> list[str]:
    """FOLD's arguments for the entries ``owed`` (what a live call server pushed)."""
    return ["[" + ",".join(owed) + "]"]


def fold(conn: redis.Redis, keys: Keys, start: str, owed: list[str] | None = None) -> int:
    """Fold ``start``'s pending counts into the counters (``owed``: these entries
    instead of the list's); returns how many entries."""
    args = [] if owed is None else fold_args(owed)
    return int(fold_script(conn, [keys.host_call_counts(start)], args))
