# Ruby's Dalli (binary protocol) against a larder with a token: SASL PLAIN with the token as
# the password works; without credentials, or with a wrong password, every command fails.
# Usage: dalli_sasl.rb HOST:PORT TOKEN; exits non-zero with the failing check.
require 'dalli'

def check(cond, what)
  abort("failed: #{what}") unless cond
end

def refused
  yield
  false
rescue Dalli::DalliError, Dalli::NetworkError, Dalli::RingError
  true
end

server, token = ARGV
opts = { socket_timeout: 5, down_retry_delay: 0, socket_max_failures: 1 }
c = Dalli::Client.new(server, opts.merge(username: 'larder', password: token))
check(c.set('from-dalli', 'with sasl', 0, raw: true), 'an authenticated set')
check(c.get('from-dalli', raw: true) == 'with sasl', 'an authenticated get')
check(c.incr('counter', 1, nil, 7) == 7, 'an authenticated incr')

anonymous = Dalli::Client.new(server, opts)
check(refused { anonymous.set('not-from-dalli', 'x', 0, raw: true) }, 'an anonymous set is refused')
check(refused { anonymous.get('from-dalli') }, 'an anonymous get is refused')
check(refused { anonymous.flush }, 'an anonymous flush is refused')

wrong = Dalli::Client.new(server, opts.merge(username: 'larder', password: token + 'x'))
check(refused { wrong.get('from-dalli') }, 'a wrong password is refused')
check(c.get('from-dalli', raw: true) == 'with sasl', 'the value is intact')
puts 'ok'
