# Rails' cache (Debian's ruby-activesupport 6.1, MemCacheStore on Dalli) against a memcached
# server: larder's memcached port, or memcached itself to check the script.
# Usage: rails_cache.rb HOST:PORT; exits non-zero with the failing check.
require 'active_support'
require 'active_support/cache'
require 'active_support/cache/mem_cache_store'

def check(cond, what)
  abort("failed: #{what}") unless cond
end

cache = ActiveSupport::Cache::MemCacheStore.new(ARGV[0], namespace: 'app', socket_timeout: 10)
cache.clear

# fetch: computed once, then read; expires_in is kept by the server.
calls = 0
v = cache.fetch('page/1', expires_in: 1) { calls += 1; { 'title' => 'Home', 'n' => [1, 2] } }
check(v == { 'title' => 'Home', 'n' => [1, 2] } && calls == 1, 'fetch computes a miss')
check(cache.fetch('page/1', expires_in: 1) { calls += 1; 'other' } == v && calls == 1, 'fetch reads a hit')
check(cache.exist?('page/1'), 'exist? of a cached key')
sleep 1.3
check(!cache.exist?('page/1'), 'expired after expires_in')
check(cache.fetch('page/1', expires_in: 60) { calls += 1; 'again' } == 'again' && calls == 2, 'recomputed after expiry')

# race_condition_ttl: once expired, the first reader recomputes while the others are served
# the stale value for up to race_condition_ttl.
cache.fetch('hot', expires_in: 1, race_condition_ttl: 10) { 'v1' }
sleep 1.3
inner = nil
fresh = cache.fetch('hot', expires_in: 1, race_condition_ttl: 10) do
  inner = cache.fetch('hot', expires_in: 1, race_condition_ttl: 10) { 'v3' }
  'v2'
end
check(fresh == 'v2', "the first reader after expiry recomputes (got #{fresh.inspect})")
check(inner == 'v1', "a reader meanwhile is served the stale value (got #{inner.inspect})")
check(cache.read('hot') == 'v2', 'the recomputed value is stored')

# read_multi and fetch_multi.
cache.write('a', 1)
cache.write('b', 'two')
check(cache.read_multi('a', 'b', 'none') == { 'a' => 1, 'b' => 'two' }, 'read_multi')
got = cache.fetch_multi('a', 'c', 'd') { |k| "computed #{k}" }
check(got == { 'a' => 1, 'c' => 'computed c', 'd' => 'computed d' }, "fetch_multi (#{got.inspect})")
check(cache.read('d') == 'computed d', 'fetch_multi stores what it computed')

# increment and decrement of raw counters (as Rails' rate limiters use them).
check(cache.increment('hits', 1, expires_in: 60).nil? || cache.read('hits', raw: true).to_i >= 0, 'increment of a missing counter')
cache.write('n', 5, raw: true)
check(cache.increment('n') == 6, 'increment')
check(cache.increment('n', 10) == 16, 'increment by 10')
check(cache.decrement('n', 3) == 13, 'decrement')
check(cache.decrement('n', 100).zero?, 'decrement stops at 0')
check(cache.read('n', raw: true).to_i.zero?, 'read of a raw counter')

# delete, exist?, clear.
check(cache.delete('a'), 'delete of a present key')
check(!cache.exist?('a'), 'deleted')
check(!cache.delete('a'), 'delete of an absent key')
cache.write('big', 'x' * 200_000)
check(cache.read('big') == 'x' * 200_000, 'a value of 200 KB (compressed by Rails)')
check(cache.clear, 'clear')
check(!cache.exist?('b') && cache.read_multi('b', 'd').empty?, 'clear removed everything')
puts 'all checks passed'
