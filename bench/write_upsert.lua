-- wrk script for bench/write.py: every request upserts a new instance (POST /device-metadata)
-- with two addresses and a small document. Arguments: <token> <base>, where base (0-99) keeps
-- the ids and addresses of one run apart from another's. One wrk thread (-t1): the counter
-- is that thread's.
local counter = 0
local token, base

function init(args)
  token = args[1]
  base = tonumber(args[2])
end

local function address(n)
  return string.format("10.%d.%d.%d", 100 + base + math.floor(n / 65536) % 50, math.floor(n / 256) % 256, n % 256)
end

request = function()
  counter = counter + 1
  local id = string.format("%08x-0000-4000-8000-%012x", base, counter)
  local body = string.format(
    '{"id":"%s","ipAddresses":["%s","%s"],"metadata":{"id":"%s","hostname":"host-%d","tags":["bench","bench","bench","bench","bench","bench","bench","bench"]}}',
    id, address(2 * counter), address(2 * counter + 1), id, counter)
  return wrk.format("POST", "/device-metadata",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}, body)
end
