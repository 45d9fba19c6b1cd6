# Ruby's Dalli (Debian's ruby-dalli, 3.0: the binary protocol) against larder.
# Usage: dalli_client.rb HOST:PORT HTTP_HOST:HTTP_PORT; exits non-zero with the failing check.
require 'dalli'
require 'net/http'

def check(cond, what)
  abort("failed: #{what}") unless cond
end

c = Dalli::Client.new(ARGV[0], socket_timeout: 10, serializer: Marshal)
http = ARGV[1]
c.flush

check(c.set('a', { 'name' => 'thumb', 'size' => 42 }), 'set of a Ruby object')
check(c.get('a') == { 'name' => 'thumb', 'size' => 42 }, 'get of a Ruby object')
check(c.get('missing').nil?, 'get of a missing key')
check(!c.add('a', 1), 'add of a present key')
check(c.add('b', 'two'), 'add of an absent key')
c.replace('nope', 1) # Dalli returns the answer's cas (0, truthy) for a miss, with memcached too
check(c.get('nope').nil?, 'replace of an absent key stores nothing')
check(c.replace('b', 'deux'), 'replace')
check(c.get_multi('a', 'b', 'nope') == { 'a' => { 'name' => 'thumb', 'size' => 42 }, 'b' => 'deux' }, 'get_multi')

# Raw values: appended to, counted, and seen over HTTP as the same bytes.
check(c.set('r', 'mid', 0, raw: true), 'raw set')
check(c.append('r', '>') && c.prepend('r', '<'), 'append and prepend')
check(c.get('r', raw: true) == '<mid>', 'after append and prepend')
check(Net::HTTP.get(URI("http://#{http}/r")) == '<mid>', 'a Dalli raw value over HTTP')
Net::HTTP.start(*http.split(':').then { |h, p| [h, p.to_i] }) { |h| h.send_request('PUT', '/from-http', 'via http') }
check(c.get('from-http', raw: true) == 'via http', 'an HTTP PUT read by Dalli')

check(c.incr('n', 1, nil, 10) == 10, 'incr of a missing key starts at its initial value')
check(c.incr('n', 5) == 15 && c.decr('n', 20) == 0, 'incr and decr')
check(c.incr('nothing', 1).nil?, 'incr of a missing key without an initial value')

check(c.cas('b') { |v| v + '!' }, 'cas block')
check(c.get('b') == 'deux!', 'value after cas')
value, cas = c.get_cas('b')
check(value == 'deux!' && cas.to_i > 0, 'get_cas')
check(c.set_cas('b', 'new', cas), 'set_cas with the current unique')
check(!c.set_cas('b', 'newer', cas), 'set_cas with a stale unique')

check(c.touch('b', 100), 'touch')
check(c.gat('b', 100) == 'new', 'gat')
check(c.delete('b') && c.get('b').nil?, 'delete')

# Get-or-compute, Diskcached's promise: the block runs once, later fetches read the cache.
runs = 0
2.times { check(c.fetch('page', 60) { runs += 1; 'rendered' } == 'rendered', 'fetch') }
check(runs == 1, 'fetch computes once')

big = 'x' * (512 * 1024)
check(c.set('big', big, 0, raw: true) && c.get('big', raw: true) == big, 'a 512 KiB value')
check(c.stats.values.first.key?('curr_connections'), 'stats')
v = c.version.values.first
check(v.start_with?('1.6.18-larder-'), "version #{v}")
c.flush
check(c.get('a').nil?, 'flush')
puts 'dalli: all checks passed'
