-- wrk script for bench/read_scale.py: each request reads /metadata as a random one of the
-- first <span> generated instances (bench/scale.py's loopback(n): 127.x.y.z from n + 65536),
-- named in X-Forwarded-For (the server trusts 127.0.0.1 as a proxy). Argument: <span>.
local span

function init(args)
  span = tonumber(args[1])
  math.randomseed(os.time())
end

request = function()
  local n = math.random(0, span - 1) + 65536
  local address = string.format("127.%d.%d.%d", math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  return wrk.format("GET", "/metadata", {["X-Forwarded-For"] = address})
end
