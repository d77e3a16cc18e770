"""The budget book's Redis scripts: what ``BudgetBook`` runs atomically in the tenant's slot.

``RESERVE_SCRIPT`` reserves a request's worst case on every budget it falls under, or nothing
(a hard budget it would overrun, or a window not yet seeded); ``SEED_SCRIPT`` raises a window's
``spent`` to what SQL booked in it, once (KEYS: the window; ARGV: the amount booked, the
window's ttl); ``SETTLE_SCRIPT`` moves a reservation to ``spent`` at the real cost, once per
request id; ``RELEASE_SCRIPT`` takes a tenant's due reservations that were never settled back
out of ``reserved``. The keys and arguments of the others are described above each; what the
scripts do together, and the keys they use, in ``gateway.accounting.budgets``.
"""

__all__ = ["RELEASE_SCRIPT", "RESERVE_SCRIPT", "SEED_SCRIPT", "SETTLE_SCRIPT"]

# KEYS: the reservation, the tenant's open set, the budget windows. ARGV: amount, request id,
# release after (ms), '1' to require seeded windows, then limit, hard, ttl of each window.
# Returns {1, ''} reserved; {2, window} not seeded; {0, window} refused because that window's
# spend alone leaves no room (spent); {3, window} refused only because of what in-flight
# requests hold (it may fit once they settle).
RESERVE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {1, ''} end
if ARGV[4] == '1' then
  for i = 3, #KEYS do
    if redis.call('HEXISTS', KEYS[i], 'seeded') == 0 then return {2, KEYS[i]} end
  end
end
local amount = tonumber(ARGV[1])
for i = 3, #KEYS do
  local a = 5 + (i - 3) * 3
  if ARGV[a + 1] == '1' then
    local spent = tonumber(redis.call('HGET', KEYS[i], 'spent') or '0')
    local reserved = tonumber(redis.call('HGET', KEYS[i], 'reserved') or '0')
    if spent + reserved + amount > tonumber(ARGV[a]) then
      if spent + amount > tonumber(ARGV[a]) then return {0, KEYS[i]} end
      return {3, KEYS[i]}
    end
  end
end
local ttl = 0
for i = 3, #KEYS do
  local a = 5 + (i - 3) * 3
  redis.call('HINCRBY', KEYS[i], 'reserved', amount)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[a + 2]))
  redis.call('HSET', KEYS[1], KEYS[i], amount)
  ttl = math.max(ttl, tonumber(ARGV[a + 2]))
end
if ttl > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('EXPIRE', KEYS[2], ttl)
end
return {1, ''}
"""

SEED_SCRIPT = """
if redis.call('HSETNX', KEYS[1], 'seeded', '1') == 1 then
  local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
  if tonumber(ARGV[1]) > spent then redis.call('HSET', KEYS[1], 'spent', ARGV[1]) end
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 1
"""

# KEYS: the reservation, the settled marker, the tenant's open set, the budget windows (booked
# when there is no reservation). ARGV: the real cost (-1: unknown), the marker's ttl, the
# windows' ttl, the request id.
SETTLE_SCRIPT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', tonumber(ARGV[2])) then return {} end
redis.call('ZREM', KEYS[3], ARGV[4])
local actual = tonumber(ARGV[1])
local out = {}
local held = redis.call('HGETALL', KEYS[1])
if #held > 0 then
  local released = redis.call('HEXISTS', KEYS[1], 'released') == 1
  for i = 1, #held, 2 do
    if held[i] ~= 'released' then
      local amount = tonumber(held[i + 1])
      local cost = actual
      if cost < 0 then cost = amount end
      if not released then redis.call('HINCRBY', held[i], 'reserved', -amount) end
      local spent = redis.call('HINCRBY', held[i], 'spent', cost)
      table.insert(out, held[i]); table.insert(out, spent)
    end
  end
  redis.call('DEL', KEYS[1])
elseif actual > 0 then
  for i = 4, #KEYS do
    local spent = redis.call('HINCRBY', KEYS[i], 'spent', actual)
    redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3]))
    table.insert(out, KEYS[i]); table.insert(out, spent)
  end
end
return out
"""

# KEYS: the tenant's open set. ARGV: the reservations' key prefix (``…:res:``), the most to
# release, how long a released reservation is kept. Returns {released, their amount, due seen}.
RELEASE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local count, total = 0, 0
for _, id in ipairs(due) do
  local key = ARGV[1] .. id
  local held = redis.call('HGETALL', key)
  if #held > 0 and redis.call('HEXISTS', key, 'released') == 0 then
    local amount = 0
    for i = 1, #held, 2 do
      amount = tonumber(held[i + 1])
      if redis.call('EXISTS', held[i]) == 1 then
        redis.call('HINCRBY', held[i], 'reserved', -amount)
      end
    end
    redis.call('HSET', key, 'released', '1')
    redis.call('EXPIRE', key, tonumber(ARGV[3]))
    count = count + 1
    total = total + amount
  end
  redis.call('ZREM', KEYS[1], id)
end
return {count, total, #due}
"""
