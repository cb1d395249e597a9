"""The batch ledger: who may run which snippet of a batch, and what has been counted.

A producer stores a batch once (its ``state`` hash) and announces it on the RQ queue.
Dispatchers on any host claim runs of its indices (fresh ones, or ones released from a
lapsed claim first) and write each result with HSETNX, first write wins. Every
dispatcher is registered (``leases``) under its worker host, and the host holds the
lease of all of them: its score in ``hosts``, in Redis server time so the hosts' clocks
do not matter, renewed in one call a beat (``HOST_BEAT``). A host whose score is older
than the lease is *lapsed*; a janitor (a worker host, or a waiting producer) fences it
and each of its dispatchers (they move to ``fenced``), releases their unfinished
indices to the batches' retry lists and forgets them. A worker host that sees its own
dispatcher die fences that one at once. A fenced host that comes back learns it from
its next beat and stops its dispatchers.

Stats are counted by the write itself, in the same script call, for the results whose
HSETNX was the first: so a result is counted exactly once however often it is written,
retried or run again, and nothing is ever written but not counted.

Batches are announced to the live *hosts* (``hosts``, renewed by the hosts' beats):
one dispatcher per host joins a batch, and may use every slot its siblings leave free
(worker/host_window.py); a claim leaves a share for every live dispatcher of another
host. A batch that more than one host could share is *open*
(``open``) from its store until its last index is claimed, and again while released
work waits: a dispatcher joins the open batches its host is not on before it first
waits on the queue, so a host that was not live when a batch was announced (a cold
fleet, a host that joins) still takes a share.

A caller that gives up cancels indices (``CANCEL``): each is given the cancellation as
its result, first write wins like any result, so it is counted once either way and a
cancelled index is never claimed nor written again; the dispatchers holding claims in
the batch hear of it on their channels. Producers hold leases too, while they have
batches in flight (``producers``): a lapsed producer's batches are cancelled.

Everything that must be atomic is a Lua script here; results cost one EVALSHA per write
of many (the result writer gathers them), a claim one per run of indices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.client import Pipeline

from codepool.common.keys import Keys
from codepool.common.queueing import MIN_SHARE

# KEYS: state, hosts, open, then producers and producer_batches, then fleet, then the
# spec's own key (without it, the spec goes in the state hash, as before it had one).
# ARGV: spec, n, run, reruns, ttl_s, lease_s, batch_id, then the producer ('' for none).
# A batch of more than MIN_SHARE snippets is open (others could share it) until its last
# index is claimed; entries older than the batch TTL go on the way. The batch goes in the
# producer's set with the submit, and the batch that makes the set non-empty takes the
# producer's lease (its heartbeat renews it from then on, and gives it up once the set is
# empty again): a producer with a batch in flight always holds a lease.
# -> {live hosts, the slots the fleet's hosts registered}.
SUBMIT = """
if KEYS[7] then
  redis.call('SET', KEYS[7], ARGV[1], 'EX', ARGV[5])
  redis.call('HSET', KEYS[1], 'n', ARGV[2], 'next', 0, 'run', ARGV[3], 'reruns', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'n', ARGV[2], 'next', 0, 'run', ARGV[3],
             'reruns', ARGV[4])
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if tonumber(ARGV[2]) > MIN_SHARE then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ARGV[5])
  redis.call('ZADD', KEYS[3], now, ARGV[7])
end
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('SADD', KEYS[5], ARGV[7])
  if redis.call('SCARD', KEYS[5]) == 1 then
    redis.call('ZADD', KEYS[4], now, ARGV[8])
    redis.call('EXPIRE', KEYS[5], ARGV[5])
  end
end
local slots = 0
if KEYS[6] then slots = tonumber(redis.call('HGET', KEYS[6], 'slots') or '0') end
return {redis.call('ZCOUNT', KEYS[2], now - ARGV[6], '+inf'), slots}
""".replace("MIN_SHARE", str(MIN_SHARE))

# KEYS: state, retry, leases, owner_batches, open, results, spec (the batch record's
# own key; without it, or for a batch stored before it, the state's ``spec`` field).
# ARGV: owner, batch_id, min_k, max_k, lease_s, need_spec ('1' on a dispatcher's first
# claim in this batch: returns the batch record too), the owner's host's dispatchers.
# -> {-2} fenced owner; {-1} no such batch; {0, '', spec} nothing left to claim;
#    {claim_id, indices, spec, last}: indices "a-b" (fresh range) or "i,j" (released
#    ones); last = 1 when nothing is left to claim after this one (no claim need follow).
# Claims are fields ``c:{id}`` = ``owner|indices`` of the state hash (one HSET with the
# ``next`` counter). Fresh runs shrink as the batch drains (guided self-scheduling):
# what is left over one plus twice the dispatchers registered on other hosts (each may
# steal a share), at least what the claimer has room for, at most max_k (what the
# claimer finishes in about a second at its pace so far: hosts that join later find
# work left). The last claim closes the batch (out of ``open``).
_CLAIM_RUN = """
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return {-2} end
local st = redis.call('HMGET', KEYS[1], 'n', 'next', 'retry')
if not st[1] then
  redis.call('ZREM', KEYS[5], ARGV[2])
  return {-1}
end
local n, nxt, retry = tonumber(st[1]), tonumber(st[2]), tonumber(st[3] or '0')
local min_k, max_k = tonumber(ARGV[3]), tonumber(ARGV[4])
local spec = false
if ARGV[6] == '1' then
  if KEYS[7] then spec = redis.call('GET', KEYS[7]) end
  if not spec then spec = redis.call('HGET', KEYS[1], 'spec') end
  redis.call('SADD', KEYS[4], ARGV[2])
end
if retry > 0 then
  local again = redis.call('LPOP', KEYS[2], min_k)
  if again then
    redis.call('HINCRBY', KEYS[1], 'retry', -#again)
    local cid = 'r' .. redis.call('HINCRBY', KEYS[1], 'seq', 1)
    local claim = table.concat(again, ',')
    redis.call('HSET', KEYS[1], 'c:' .. cid, ARGV[1] .. '|' .. claim)
    local last = (retry - #again <= 0 and nxt >= n) and 1 or 0
    if last == 1 and n > MIN_SHARE then redis.call('ZREM', KEYS[5], ARGV[2]) end
    return {cid, claim, spec, last}
  end
end
if nxt >= n then
  if n > MIN_SHARE then redis.call('ZREM', KEYS[5], ARGV[2]) end
  return {0, '', spec}
end
local left = n - nxt
local live = redis.call('ZCARD', KEYS[3])
local k = math.ceil(left / (1 + 2 * math.max(0, live - tonumber(ARGV[7]))))
k = math.min(math.max(k, min_k), max_k, left)
local claim = nxt .. '-' .. (nxt + k - 1)
redis.call('HSET', KEYS[1], 'next', nxt + k, 'c:f' .. nxt, ARGV[1] .. '|' .. claim)
local last = (k == left and retry <= 0) and 1 or 0
if last == 1 and n > MIN_SHARE then redis.call('ZREM', KEYS[5], ARGV[2]) end
return {'f' .. nxt, claim, spec, last}
""".replace("MIN_SHARE", str(MIN_SHARE))

# KEYS[6]: results. Once a batch has cancelled indices (ledger.CANCEL: their result is
# the cancellation), a claim and its record leave them out ("i,j" form; '' when nothing
# of it is left to run, and no record); a batch without any costs one HGET a claim.
CLAIM = (
    "local function claim()\n"
    + _CLAIM_RUN
    + """end
local reply = claim()
if reply[4] == nil or not KEYS[6] then return reply end
if tonumber(redis.call('HGET', KEYS[1], 'cancelled') or '0') <= 0 then return reply end
local kept = {}
local function keep(i)
  if redis.call('HEXISTS', KEYS[6], i) == 0 then kept[#kept + 1] = i end
end
local a, b = string.match(reply[2], '^(%d+)-(%d+)$')
if a then
  for i = tonumber(a), tonumber(b) do keep(i) end
else
  for i in string.gmatch(reply[2], '%d+') do keep(tonumber(i)) end
end
reply[2] = table.concat(kept, ',')
if #kept == 0 then
  redis.call('HDEL', KEYS[1], 'c:' .. reply[1])
else
  redis.call('HSET', KEYS[1], 'c:' .. reply[1], ARGV[1] .. '|' .. reply[2])
end
return reply
"""
)

# KEYS: results, done, then the counter hashes (the minute hash second among them, so
# KEYS[4]). ARGV: ttl_s, minute_ttl_s, then ten per result: index, result, done entry,
# status, latency_us, exec_us, queue_us, latency bucket field, zygote field and limit
# field ('' for none).
# HSETNX each result; push its done entry (index and result, so the producer needs no
# second read) and count it only on a first write; (re)set the keys' TTL, so whatever a
# write leaves, a list the producer drained and this push made anew included, expires.
# -> one 1 (first write) or 0 per result. One call for many results: Redis wakes once for
# them, a producer blocked on the done list gets them in one pop, and the counters get
# one HINCRBY per field and hash.
WRITE = """
local firsts, pushed, sums = {}, {}, {}
local function add(field, v) sums[field] = (sums[field] or 0) + v end
for i = 3, #ARGV, 10 do
  local first = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  firsts[#firsts + 1] = first
  if first == 1 then
    pushed[#pushed + 1] = ARGV[i + 2]
    add(ARGV[i + 3], 1); add(ARGV[i + 7], 1)
    add('latency_us', tonumber(ARGV[i + 4]))
    add('exec_us', tonumber(ARGV[i + 5]))
    add('queue_us', tonumber(ARGV[i + 6]))
    if ARGV[i + 8] ~= '' then add(ARGV[i + 8], 1) end
    if ARGV[i + 9] ~= '' then add(ARGV[i + 9], 1) end
  end
end
if #pushed > 0 then
  redis.call('RPUSH', KEYS[2], unpack(pushed))
  redis.call('EXPIRE', KEYS[2], ARGV[1])
  add('calls', #pushed)
  for k = 3, #KEYS do
    for field, v in pairs(sums) do
      if v ~= 0 then redis.call('HINCRBY', KEYS[k], field, v) end
    end
  end
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return firsts
"""

# KEYS: hosts, leases, the host's owners, fenced, producers, host_slots, fleet, then on a
# lease's first beat the host's record of its latest lease (Keys.host_start). ARGV: the host's lease
# ('' to only watch), lease_s, janitor ('1': the janitor's round too), first ('1': the
# lease's first beat), its slots, then dispatchers new since the last beat.
# A worker host's beat, one call whatever its slot count: it renews the host's lease, its
# score in ``hosts``, which is the lease of all its dispatchers. A lease is per start
# (``host~{token}``, ``host~{token}.N`` after N losses): a lease's first beat records it
# as the host's latest and answers the one it replaces (on a start's first beat: a
# start of the same name killed -9, for the new start to fence at once). A dispatcher is
# registered once, when it starts (``leases`` and the host's owner set); a host that was
# fenced is not renewed (XX) and learns it was lost. The janitor's round (not every
# beat: worker/lease.py spreads them over the fleet) lists the lapsed hosts, the fenced
# hosts and dispatchers a janitor left unreleased for a lease (it died on the way), the
# lapsed producers, and counts the live hosts.
# -> {lost, replaced} or, with the round, {lost, replaced, lapsed hosts and fenced
#    leftovers, lapsed producers, live hosts}, then the server's TIME (seconds,
#    microseconds); lost = 1 when the host was fenced; replaced: the lease of the
#    host's previous start ('' for none).
HOST_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local lost, replaced = 0, ''
if ARGV[1] ~= '' then
  if ARGV[4] == '1' then
    if KEYS[8] then
      replaced = redis.call('GET', KEYS[8]) or ''
      if replaced == ARGV[1] then replaced = '' end
      redis.call('SET', KEYS[8], ARGV[1], 'EX', 604800)
    end
    redis.call('ZADD', KEYS[1], now, ARGV[1])
    if redis.call('HSETNX', KEYS[6], ARGV[1], ARGV[5]) == 1 then
      redis.call('HINCRBY', KEYS[7], 'slots', ARGV[5])
    end
  elseif redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[1]) == 0 then
    lost = 1
  end
  if lost == 0 and #ARGV > 5 then
    local pairs_ = {}
    for i = 6, #ARGV do pairs_[#pairs_ + 1] = now; pairs_[#pairs_ + 1] = ARGV[i] end
    redis.call('ZADD', KEYS[2], 'NX', unpack(pairs_))
    redis.call('SADD', KEYS[3], unpack(ARGV, 6, #ARGV))
  end
end
if ARGV[3] ~= '1' then return {lost, replaced, t[1], t[2]} end
local since = now - ARGV[2]
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', since, 'LIMIT', 0, 16)
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', since, 'LIMIT', 0, 16)) do
  lapsed[#lapsed + 1] = name
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', since, 'LIMIT', 0, 16)
return {lost, replaced, lapsed, gone, redis.call('ZCOUNT', KEYS[1], since, '+inf'), t[1], t[2]}
"""

# KEYS: hosts, leases, fenced, host_slots, fleet. ARGV: a host or a dispatcher, lease_s
# (0: now, whatever
# its score: a dispatcher its worker host saw die, or one of a lapsed host). Moves a
# lapsed host out of ``hosts`` (its beats find it gone), a dispatcher out of ``leases``
# (it may claim nothing more), into ``fenced`` until a janitor has released its work.
# -> 1 if it is fenced now (or already was), 0 if it holds its lease (or is gone).
FENCE = """
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 1 end
local where = KEYS[1]
local s = redis.call('ZSCORE', where, ARGV[1])
if not s then
  where = KEYS[2]
  s = redis.call('ZSCORE', where, ARGV[1])
end
if not s then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if tonumber(ARGV[2]) > 0 and tonumber(s) > now - ARGV[2] then return 0 end
redis.call('ZREM', where, ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
if where == KEYS[1] then
  local slots = redis.call('HGET', KEYS[4], ARGV[1])
  if slots then
    redis.call('HDEL', KEYS[4], ARGV[1])
    redis.call('HINCRBY', KEYS[5], 'slots', 0 - tonumber(slots))
  end
end
return 1
"""

# KEYS: hosts, the host's owners, host_slots, fleet. ARGV: host. A host that stops
# cleanly (its dispatchers unregistered) gives its lease up, and its slots.
LEAVE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
local slots = redis.call('HGET', KEYS[3], ARGV[1])
if slots then
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('HINCRBY', KEYS[4], 'slots', 0 - tonumber(slots))
end
return 1
"""

# KEYS: fenced, owner_batches, host's owners (both of the fenced name). ARGV: the name.
# Drop a fenced host or dispatcher once its work is released.
FORGET = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then redis.call('DEL', KEYS[2], KEYS[3]) end
return 0
"""

# The owner's claims are found with HSCAN MATCH 'c:*' (once each, whatever the scan
# returns twice), not HGETALL: the state hash holds the batch's spec (up to
# max_batch_bytes) and a re-run count per index, none of which a release reads.
# KEYS: state, retry, results, done, open. ARGV: owner, graceful ('1': a stopping owner
# gives back what it never started, which costs no re-run), ttl_s, batch_id. Sets the
# done list's TTL again: the lapsed owner may have made it anew after the producer had
# drained it. Released work opens the batch again (a host that joins takes it too).
# -> {released, finished indices (orphans), exhausted indices, run tag, unclaimed fresh
#    indices, reruns allowed}; released = -1 when the batch is gone.
RELEASE = """
local st = redis.call('HMGET', KEYS[1], 'reruns', 'run', 'n', 'next')
if not st[1] then return {-1, {}, {}, '', 0, 0} end
local reruns = tonumber(st[1])
local again, orphans, exhausted = {}, {}, {}
local function visit(i)
  if redis.call('HEXISTS', KEYS[3], i) == 1 then
    orphans[#orphans + 1] = i
  elseif ARGV[2] == '1' then
    again[#again + 1] = i
  elseif redis.call('HINCRBY', KEYS[1], 'r' .. i, 1) > reruns then
    exhausted[#exhausted + 1] = i
  else
    again[#again + 1] = i
  end
end
local mine, seen, cursor = {}, {}, '0'
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'MATCH', 'c:*', 'COUNT', 1000)
  cursor = page[1]
  for p = 1, #page[2], 2 do
    local owner, claim = string.match(page[2][p + 1], '^(.*)|([^|]*)$')
    if owner == ARGV[1] and not seen[page[2][p]] then
      seen[page[2][p]] = true
      mine[#mine + 1] = {page[2][p], claim}
    end
  end
until cursor == '0'
for _, held in ipairs(mine) do
  local field, claim = held[1], held[2]
  local a, b = string.match(claim, '^(%d+)-(%d+)$')
  if a then
    for i = tonumber(a), tonumber(b) do visit(i) end
  else
    for i in string.gmatch(claim, '%d+') do visit(tonumber(i)) end
  end
  redis.call('HDEL', KEYS[1], field)
end
for p = 1, #again, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(again, p, math.min(p + 999, #again)))
end
if #again > 0 then
  redis.call('HINCRBY', KEYS[1], 'retry', #again)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  if tonumber(st[3]) > MIN_SHARE then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[5], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[4])
  end
end
redis.call('EXPIRE', KEYS[4], ARGV[3])
return {#again, orphans, exhausted, st[2] or '', tonumber(st[3]) - tonumber(st[4]), reruns}
""".replace("MIN_SHARE", str(MIN_SHARE))


# KEYS: state, results, done, retry, open, then the counter hashes (the minute hash
# second among them, so KEYS[7]). ARGV: ttl_s, minute_ttl_s, the cancellation's result (an
# encoded ExecResult of status ``cancelled``), the same as msgpack bin (the done entry's
# tail), the batch id, the channel prefix (Keys.cancel_channel('')), 'all' (the whole
# batch) or '', then the indices to cancel.
# Cancelling writes the cancellation as the index's result, with HSETNX like any result
# (first write wins): an index that has a result keeps it, one that is cancelled never
# gets another (WRITE's HSETNX finds it taken and counts nothing), so every index is
# counted once, as ``calls`` (and its status) or as ``cancelled``. Each new one is pushed
# to the done list (a producer blocked on it wakes, and a batch mate's collector skips
# it), the batch's ``cancelled`` count makes CLAIM leave them out, and every dispatcher
# holding claims in the batch hears ``{batch_id}|all`` or ``{batch_id}|i,j`` on its
# channel, to drop what it has not started and kill what runs. The whole batch also has
# nothing left to claim (``next`` = n, no released index waits) and is not open: no host
# joins it to find that out.
# -> how many indices were newly cancelled; -1 when the batch is gone.
CANCEL = """
local st = redis.call('HMGET', KEYS[1], 'n')
if not st[1] then return -1 end
local n = tonumber(st[1])
local whole = ARGV[7] == 'all'
local chosen = {}
if whole then
  for i = 0, n - 1 do chosen[#chosen + 1] = i end
  redis.call('HSET', KEYS[1], 'next', n, 'retry', 0)
  redis.call('DEL', KEYS[4])
  redis.call('ZREM', KEYS[5], ARGV[5])
else
  for a = 8, #ARGV do
    local i = tonumber(ARGV[a])
    if i and i >= 0 and i < n then chosen[#chosen + 1] = i end
  end
end
local function packint(i)
  if i < 128 then return string.char(i) end
  if i < 256 then return '\\204' .. string.char(i) end
  if i < 65536 then return '\\205' .. string.char(math.floor(i / 256), i % 256) end
  return '\\206' .. string.char(math.floor(i / 16777216) % 256, math.floor(i / 65536) % 256,
                                 math.floor(i / 256) % 256, i % 256)
end
local newly, pushed = {}, {}
for _, i in ipairs(chosen) do
  if redis.call('HSETNX', KEYS[2], i, ARGV[3]) == 1 then
    newly[#newly + 1] = i
    pushed[#pushed + 1] = '\\146' .. packint(i) .. ARGV[4]
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
if #newly == 0 then return 0 end
for p = 1, #pushed, 1000 do
  redis.call('RPUSH', KEYS[3], unpack(pushed, p, math.min(p + 999, #pushed)))
end
redis.call('EXPIRE', KEYS[3], ARGV[1])
for k = 6, #KEYS do redis.call('HINCRBY', KEYS[k], 'cancelled', #newly) end
redis.call('EXPIRE', KEYS[7], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'cancelled', #newly)
local message = ARGV[5] .. '|' .. (whole and 'all' or table.concat(newly, ','))
local owners, cursor = {}, '0'
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'MATCH', 'c:*', 'COUNT', 1000)
  cursor = page[1]
  for p = 2, #page[2], 2 do
    local owner = string.match(page[2][p], '^(.*)|[^|]*$')
    if owner and not owners[owner] then
      owners[owner] = true
      redis.call('PUBLISH', ARGV[6] .. owner, message)
    end
  end
until cursor == '0'
return #newly
"""

# KEYS: producers, producer_batches. ARGV: producer, ttl_s, then batches it is through
# with. Renews a producer's lease while it has batches in flight and forgets it once it
# has none (a submit, which renews the lease too, may put one in meanwhile: then it stays).
PRODUCER_BEAT = """
if #ARGV > 2 then redis.call('SREM', KEYS[2], unpack(ARGV, 3, #ARGV)) end
if redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# KEYS: producers, producer_batches. ARGV: producer, lease_s. Takes a lapsed producer's
# batches for a janitor to cancel (one janitor gets them).
# -> its batches in flight ({} when it is not lapsed, or another janitor took them).
ABANDON = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s then return {} end
local t = redis.call('TIME')
if tonumber(s) > tonumber(t[1]) + tonumber(t[2]) / 1e6 - ARGV[2] then return {} end
redis.call('ZREM', KEYS[1], ARGV[1])
local batches = redis.call('SMEMBERS', KEYS[2])
redis.call('DEL', KEYS[2])
return batches
"""


class Script:
    """A Lua script called by SHA, loaded again if the server forgot it (a restart)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, conn: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return conn.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            conn.script_load(self.source)
            return conn.evalsha(self.sha, len(keys), *keys, *args)

    def queue(self, pipe: Pipeline, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Add the call to a pipeline; the caller loads the script on NoScriptError."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def load(self, conn: redis.Redis) -> None:
        conn.script_load(self.source)


submit_script = Script(SUBMIT)
claim_script = Script(CLAIM)
write_script = Script(WRITE)
host_beat_script = Script(HOST_BEAT)
fence_script = Script(FENCE)
leave_script = Script(LEAVE)
forget_script = Script(FORGET)
release_script = Script(RELEASE)
cancel_script = Script(CANCEL)
producer_beat_script = Script(PRODUCER_BEAT)
abandon_script = Script(ABANDON)


def host_beat(
    conn: redis.Redis,
    keys: Keys,
    *,
    host: str,
    lease_s: float,
    first: bool = False,
    slots: int = 0,
    new: Sequence[str] = (),
    janitor: bool = False,
    start_of: str = "",
) -> HostBeat:
    """One ``HOST_BEAT`` call: renew the worker host's lease ``host`` ('' only
    watches; ``first`` takes it, registering its ``slots``) and register its ``new``
    dispatchers; with ``janitor``, the janitor's round too. ``start_of`` (with
    ``first``): the host's name: the lease is recorded as its latest, and the one it
    replaces comes back as ``replaced``."""
    beat_keys = [
        keys.hosts(),
        keys.leases(),
        keys.host_owners(host),
        keys.fenced(),
        keys.producers(),
        keys.host_slots(),
        keys.fleet(),
    ]
    if start_of and first:
        beat_keys.append(keys.host_start(start_of))
    reply = host_beat_script(
        conn,
        beat_keys,
        [host, lease_s, "1" if janitor else "0", "1" if first else "0", slots, *new],
    )
    beat = HostBeat(lost=int(reply[0]) == 1, replaced=_text(reply[1]))
    beat.server_time = int(reply[-2]) + int(reply[-1]) / 1e6
    if janitor:
        beat.lapsed = [_text(name) for name in reply[2]]
        beat.lapsed_producers = [_text(producer) for producer in reply[3]]
        beat.live = int(reply[4])
    return beat


@dataclass
class HostBeat:
    """What a ``HOST_BEAT`` call answered: whether the host was fenced (its lease, and
    all its dispatchers', lost) and, from a janitor's round, the hosts (and fenced
    leftovers) and producers that lapsed and how many hosts are live (None without)."""

    lost: bool
    replaced: str = ""  # the host's latest lease before this one, on a lease's first beat
    lapsed: list[str] = field(default_factory=list)
    lapsed_producers: list[str] = field(default_factory=list)
    live: int | None = None
    server_time: float | None = None  # Redis's clock when it ran the beat (seconds)


def leased_dispatchers(conn: redis.Redis, keys: Keys, host: str, lease_s: float) -> list[str]:
    """The dispatchers of worker host ``host`` that hold a lease now: those registered
    under a lease of the host (``host``, or ``host~N`` once it was fenced and came
    back) whose last beat is younger than ``lease_s`` (server time). For ops and tests:
    it reads the whole host list."""
    seconds, micros = conn.time()
    since = seconds + micros / 1e6 - lease_s
    owners: list[str] = []
    for raw in cast(list[bytes], conn.zrangebyscore(keys.hosts(), since, "+inf")):
        name = _text(raw)
        if name == host or name.startswith(host + "~"):
            owners += [_text(owner) for owner in conn.smembers(keys.host_owners(name))]
    return sorted(owners)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def parse_indices(claim: str) -> list[int]:
    """The indices of a claim as CLAIM returns it: ``a-b`` or ``i,j,k``."""
    if "-" in claim:
        first, last = claim.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(i) for i in claim.split(",") if i]
