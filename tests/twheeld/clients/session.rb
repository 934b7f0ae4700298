# SPDX-License-Identifier: MIT
# One scripted session of the Debian client ruby-beaneater against a
# beanstalkd-protocol server on 127.0.0.1:PORT. Prints one line per step;
# job ids are printed relative to the first one, so two servers'
# transcripts compare line by line.
# Usage: ruby session.rb PORT
require 'beaneater'

out = []
base = nil
rel = ->(id) { "J#{id.to_i - base}" }
def err
  "ok #{yield.inspect}"
rescue Beaneater::NotFoundError, Beaneater::TimedOutError,
       Beaneater::NotIgnoredError => e
  "error #{e.class.name.split('::').last}"
end

b = Beaneater.new("127.0.0.1:#{ARGV[0]}")
tube = b.tubes['rb-tube']
b.tubes.watch!('rb-tube')
out << "watched #{b.tubes.watched.map(&:name).inspect}"
r = tube.put('alpha', pri: 10, ttr: 5)
base = r[:id].to_i
out << "put #{r[:status]} #{rel.(r[:id])}"
r = tube.put('beta', pri: 5, delay: 2, ttr: 5)
out << "put delayed #{r[:status]} #{rel.(r[:id])}"
j = tube.peek(:delayed)
out << "peek-delayed #{rel.(j.id)} #{j.body}"
s = j.stats
out << "stats-job #{s.state} #{s.pri} #{s.delay} #{s.ttr} #{s.tube}"
j = b.tubes.reserve
out << "reserve #{rel.(j.id)} #{j.body} #{j.reserved?}"
s = j.stats
out << "stats-job #{s.state} #{s.pri} #{s.ttr} #{s.reserves}"
out << "touch #{j.touch[:status]}"
out << "release #{j.release(pri: 20, delay: 0)[:status]}"
j = b.tubes.reserve(1)
out << "reserve-with-timeout #{rel.(j.id)} #{j.body}"
out << "bury #{j.bury(pri: 30)[:status]}"
p = tube.peek(:buried)
out << "peek-buried #{rel.(p.id)} #{p.body}"
out << "kick #{tube.kick(10)[:status]} #{tube.kick(10)[:id]}"
s = j.stats
out << "stats-job #{s.state} #{s.pri} #{s.reserves} #{s.releases} " \
       "#{s.buries} #{s.kicks}"
out << "delete #{j.delete[:status]}"
out << "delete again #{err { j.delete[:status] }}"
j = b.tubes.reserve(4)
out << "reserve-with-timeout #{rel.(j.id)} #{j.body}"
out << "delete #{j.delete[:status]}"
out << "reserve-with-timeout 0 #{err { b.tubes.reserve(0) }}"
s = tube.stats
out << "stats-tube #{s.name} #{s.current_jobs_ready} " \
       "#{s.current_jobs_buried} #{s.total_jobs} #{s.current_using} " \
       "#{s.current_watching} #{s.cmd_delete}"
s = b.stats
out << "stats #{s.current_jobs_ready} #{s.current_jobs_buried} " \
       "#{s.cmd_put} #{s.cmd_bury} #{s.cmd_kick} #{s.cmd_touch} " \
       "#{s.cmd_release} #{s.cmd_delete} #{s.total_jobs} #{s.current_tubes}"
out << "tubes #{b.tubes.all.map(&:name).sort.inspect}"
out << "used #{b.tubes.used.name}"
out << "pause #{tube.pause(1)[:status]}"
out << "stats-tube missing #{err { b.tubes['nosuch'].stats.name }}"
b.close
puts out
