"""The Lua scripts that make check-and-reserve and settle atomic in Redis.

The scripts take the tenant's keys with KEYS[3..5] = rate, holds, hold-expiry in the same places, and
share a prelude: GCRA refunds (the Lua twin of :mod:`.gcra`, in microseconds), dropping a hold, and the
epoch fence. Numbers are formatted explicitly: Lua's default ``%.14g`` would turn epoch microseconds into
exponent notation. A lapsed hold (its process died before settling) is purged on the tenant's next script run.

Every script that writes is fenced: it takes the epoch key and the epoch its caller has joined, and does
nothing but fail with ``STALE_EPOCH`` when they differ. A Redis that came back empty (no epoch, or a newer
one) so refuses a process's reservations and settles until that process has put back what it knows
(:mod:`.rebuild`), however many of its calls were already on their way. An empty fence is not checked.
"""

from __future__ import annotations

_PRELUDE = """
local base = ARGV[1]
local now = tonumber(ARGV[2])
local WINDOW = 60000000
local function int(x) return string.format('%.0f', x) end
local function num(key, field) return tonumber(redis.call('HGET', key, field)) or 0 end

local function touch_rate()
  local last = math.max(num(KEYS[3], 'rpm'), num(KEYS[3], 'tpm'))
  if last > 0 then redis.call('PEXPIRE', KEYS[3], int(math.max(0, last - now) / 1000 + 1000)) end
end

local function refund(field, limit, amount)
  if limit <= 0 or amount == 0 then return end
  local tat = num(KEYS[3], field)
  local t
  if amount < 0 then t = math.max(tat, now) - amount * WINDOW / limit
  else t = math.max(tat - amount * WINDOW / limit, now) end
  redis.call('HSET', KEYS[3], field, string.format('%.17g', t))
end

-- mode 0: drop only (replay, lapse); 1: settle, refund reserved tokens down to `actual`; 2: release all
local function drop_hold(id, mode, actual)
  local rec = redis.call('HGET', KEYS[4], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  if not rec then return end
  local day, month, usd, hosted, tokens, rpm, tpm =
    string.match(rec, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(-?%d+)|(-?%d+)$')
  for _, key in ipairs({base .. ':d:' .. day, base .. ':m:' .. month}) do
    if redis.call('EXISTS', key) == 1 then
      if usd ~= '0' then redis.call('HINCRBY', key, 'held', '-' .. usd) end
      if hosted ~= '0' then redis.call('HINCRBY', key, 'hosted_held', '-' .. hosted) end
    end
  end
  if mode == 1 then
    refund('tpm', tonumber(tpm), tonumber(tokens) - actual)
  elseif mode == 2 then
    refund('rpm', tonumber(rpm), 1)
    refund('tpm', tonumber(tpm), tonumber(tokens))
  end
end

local function stale(epoch_key, epoch)
  if epoch ~= '' and redis.call('GET', epoch_key) ~= epoch then
    return redis.error_reply('STALE_EPOCH Redis lost the shared rollups this process joined')
  end
end

local function purge_lapsed()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ARGV[2], 'LIMIT', 0, 100)) do
    drop_hold(id, 0, 0)
  end
end
"""

RESERVE = (
    _PRELUDE
    + """
-- KEYS: 1 day rollup, 2 month rollup, 3 rate, 4 holds, 5 hold-expiry, 6 epoch
-- ARGV: 1 base, 2 now_us, 3 hold id, 4 tokens, 5 usd_nano, 6 hosted (0/1), 7 rpm, 8 tpm, 9 usd/day,
--       10 usd/month, 11 hosted usd/day, 12 hosted usd/month (limits: -1 = none), 13 hold lapses at (us),
--       14 day tag, 15 month tag, 16 day ttl s, 17 month ttl s, 18 epoch joined
-- Returns {1, day, month, hosted day, hosted month committed (nano), rpm tat, tpm tat}
--      or {0, rpm, tpm, usd/day, usd/month, hosted/day, hosted/month}: -2 fine, -1 never, 0 refused,
--         > 0 microseconds until a rate limit admits the request.
local fenced = stale(KEYS[6], ARGV[18])
if fenced then return fenced end
purge_lapsed()
local tokens, usd, hosted = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local function committed(key, spent, held) return num(key, spent) + num(key, held) end
local day_total = committed(KEYS[1], 't.usd', 'held')
local month_total = committed(KEYS[2], 't.usd', 'held')
local day_hosted = committed(KEYS[1], 'k:hosted.usd', 'hosted_held')
local month_hosted = committed(KEYS[2], 'k:hosted.usd', 'hosted_held')

local function rate(field, limit, cost)
  if limit < 0 then return -2, nil end
  if cost > limit then return -1, nil end
  local new_tat = math.max(num(KEYS[3], field), now) + cost * WINDOW / limit
  local wait = new_tat - WINDOW - now
  if wait > 1 then return math.ceil(wait), nil end
  return -2, new_tat
end
local function budget(limit, spent, applies)
  if limit < 0 or not applies then return -2 end
  if usd > limit then return -1 end
  if spent + usd > limit then return 0 end
  return -2
end

local rpm, tpm = tonumber(ARGV[7]), tonumber(ARGV[8])
local rpm_verdict, rpm_tat = rate('rpm', rpm, 1)
local tpm_verdict, tpm_tat = rate('tpm', tpm, tokens)
local verdicts = {
  rpm_verdict, tpm_verdict,
  budget(tonumber(ARGV[9]), day_total, true), budget(tonumber(ARGV[10]), month_total, true),
  budget(tonumber(ARGV[11]), day_hosted, hosted), budget(tonumber(ARGV[12]), month_hosted, hosted),
}
for _, v in ipairs(verdicts) do
  if v ~= -2 then return {0, unpack(verdicts)} end
end

if rpm_tat then redis.call('HSET', KEYS[3], 'rpm', string.format('%.17g', rpm_tat)) end
if tpm_tat then redis.call('HSET', KEYS[3], 'tpm', string.format('%.17g', tpm_tat)) end
touch_rate()
local hosted_usd = hosted and usd or 0
for i, key in ipairs({KEYS[1], KEYS[2]}) do
  redis.call('HINCRBY', key, 'held', ARGV[5])
  if hosted then redis.call('HINCRBY', key, 'hosted_held', ARGV[5]) end
  redis.call('EXPIRE', key, ARGV[15 + i])
end
local record = table.concat({ARGV[14], ARGV[15], ARGV[5], int(hosted_usd), ARGV[4], ARGV[7], ARGV[8]}, '|')
redis.call('HSET', KEYS[4], ARGV[3], record)
redis.call('ZADD', KEYS[5], ARGV[13], ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[16])  -- an idle tenant's holds go with the day rollups they count in
redis.call('EXPIRE', KEYS[5], ARGV[16])
local rates = redis.call('HMGET', KEYS[3], 'rpm', 'tpm')
return {1, int(day_total + usd), int(month_total + usd), int(day_hosted + hosted_usd),
        int(month_hosted + hosted_usd), rates[1] or '', rates[2] or ''}
"""
)

RECORD = (
    _PRELUDE
    + """
-- A batch of one tenant's bookings in one UTC day and 10-minute slot: each drops its hold (if any) and counts its
-- entry (if any) once; the rollups and the series are added up and written once for the whole batch.
-- KEYS: 1 day rollup, 2 month rollup, 3 rate, 4 holds, 5 hold-expiry, 6 series, 7 ids, 8 stream, 9 epoch
-- ARGV: 1 base, 2 now_us (the batch's latest), 3 day ttl, 4 month ttl, 5 series ttl, 6 ids ttl, 7 stream maxlen,
--       8 epoch joined, then 14 per booking: now_us, hold id ('' none), hold mode, actual tokens, entry id
--       ('' none), kind, backend, usd_nano, equiv_nano, prompt, cached, completion, minute of day, entry (JSON)
-- Returns how many entries were counted (the others had been already: a replay).
local fenced = stale(KEYS[9], ARGV[8])
if fenced then return fenced end
purge_lapsed()
local rollup, rollup_fields, series, series_fields = {}, {}, {}, {}
local function add(sums, fields, field, value)
  if sums[field] == nil then
    sums[field] = 0
    fields[#fields + 1] = field
  end
  sums[field] = sums[field] + value
end
local counted, ids = 0, false
for i = 9, #ARGV, 14 do
  now = tonumber(ARGV[i])
  if ARGV[i + 1] ~= '' then drop_hold(ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])) end
  local id = ARGV[i + 4]
  if id ~= '' then
    ids = true
    if redis.call('SADD', KEYS[7], id) == 1 then
      counted = counted + 1
      local kind, usd = ARGV[i + 5], tonumber(ARGV[i + 7])
      local sums = {{'usd', usd}, {'equiv', tonumber(ARGV[i + 8])}, {'n', 1}, {'prompt', tonumber(ARGV[i + 9])},
                    {'cached', tonumber(ARGV[i + 10])}, {'completion', tonumber(ARGV[i + 11])}}
      for _, scope in ipairs({'t', 'k:' .. kind, 'b:' .. ARGV[i + 6]}) do
        for _, sum in ipairs(sums) do
          if sum[2] ~= 0 then add(rollup, rollup_fields, scope .. '.' .. sum[1], sum[2]) end
        end
      end
      local bucket = ARGV[i + 12] .. ':' .. kind
      add(series, series_fields, bucket .. '.usd', usd)
      add(series, series_fields, bucket .. '.n', 1)
      redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[7], '*', 'id', id, 'entry', ARGV[i + 13])
    end
  end
end
now = tonumber(ARGV[2])
touch_rate()
if ids then redis.call('EXPIRE', KEYS[7], ARGV[6]) end  -- a replay seen again keeps its slot alive too
if counted == 0 then return 0 end
for i, key in ipairs({KEYS[1], KEYS[2]}) do
  for _, field in ipairs(rollup_fields) do redis.call('HINCRBY', key, field, int(rollup[field])) end
  redis.call('EXPIRE', key, ARGV[2 + i])
end
for _, field in ipairs(series_fields) do redis.call('HINCRBY', KEYS[6], field, int(series[field])) end
redis.call('EXPIRE', KEYS[6], ARGV[5])
return counted
"""
)

HOLD = (
    _PRELUDE
    + """
-- Holds again what a request in flight holds, in a Redis that lost it (it came back empty) or never had it
-- (reserved in this process while Redis was away). A hold Redis still has is left as it is. No rate charge
-- comes with it: the request's settle or release refunds none.
-- KEYS: 1 day rollup, 2 month rollup, 3 rate, 4 holds, 5 hold-expiry, 6 epoch
-- ARGV: 1 base, 2 now_us, 3 hold id, 4 usd_nano, 5 hosted usd_nano, 6 lapses at (us), 7 day tag, 8 month tag,
--       9 day ttl s, 10 month ttl s, 11 epoch joined
-- Returns 1 when the hold was put back, 0 when Redis had it.
local fenced = stale(KEYS[6], ARGV[11])
if fenced then return fenced end
local record = table.concat({ARGV[7], ARGV[8], ARGV[4], ARGV[5], '0', '0', '0'}, '|')
if redis.call('HSETNX', KEYS[4], ARGV[3], record) == 0 then return 0 end
for i, key in ipairs({KEYS[1], KEYS[2]}) do
  redis.call('HINCRBY', key, 'held', ARGV[4])
  if ARGV[5] ~= '0' then redis.call('HINCRBY', key, 'hosted_held', ARGV[5]) end
  redis.call('EXPIRE', key, ARGV[8 + i])
end
redis.call('ZADD', KEYS[5], ARGV[6], ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[9])
redis.call('EXPIRE', KEYS[5], ARGV[9])
return 1
"""
)


REBUILD = """
-- One tenant's rollups, rebuilt from one process's ledger after Redis came back empty.
-- KEYS: 1 marker (this ledger, this epoch), 2 month rollup, 3.. day rollups
-- ARGV: 1 marker ttl, 2 month ttl, 3 day ttl, then nine per group: day key index, kind, backend,
--       n, prompt, cached, completion, usd_nano, equiv_nano
-- Returns 0 when this ledger already rebuilt this epoch (nothing done), else 1.
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local i = 4
while i <= #ARGV do
  local sums = {{'n', ARGV[i + 3]}, {'prompt', ARGV[i + 4]}, {'cached', ARGV[i + 5]},
                {'completion', ARGV[i + 6]}, {'usd', ARGV[i + 7]}, {'equiv', ARGV[i + 8]}}
  for _, key in ipairs({KEYS[tonumber(ARGV[i])], KEYS[2]}) do
    for _, scope in ipairs({'t', 'k:' .. ARGV[i + 1], 'b:' .. ARGV[i + 2]}) do
      for _, sum in ipairs(sums) do
        if sum[2] ~= '0' then redis.call('HINCRBY', key, scope .. '.' .. sum[1], sum[2]) end
      end
    end
  end
  i = i + 9
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
for k = 3, #KEYS do redis.call('EXPIRE', KEYS[k], ARGV[3]) end
return 1
"""
