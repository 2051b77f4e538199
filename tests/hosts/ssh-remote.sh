#!/bin/sh
# ssh-remote.sh COMMAND: the far end of the simulated hosts' ssh (see simhosts.py), run in the
# host under the ssh process's own pid. COMMAND runs under `sh -c` in a session of its own that
# is no descendant of the ssh process (as over a network: nothing on the calling host reaches
# it through the process tree); this end waits for it and exits with its status. When the ssh
# end goes away (ended by a signal, or killed) while the host is on the network, the command's
# session gets SIGHUP, as sshd gives it when the connection closes; a host cut off hears nothing.
dir=$(mktemp -d)
client=$$
on_network() { ip -o link show eth0 2>/dev/null | grep -q LOWER_UP; }
# Each detached twice over (the middle shell exits at once): the command, then a watcher.
sh -c 'setsid sh -c "sh -c \"\$0\"; echo \$? > \"\$1/status\"" "$0" "$1" &
       echo $! > "$1/pid"' "$1" "$dir"
cmd=$(cat "$dir/pid")
sh -c 'setsid sh -c "while kill -0 \$0 && kill -0 \$1; do sleep 0.5; done 2>/dev/null
                     kill -0 \$1 2>/dev/null || exit 0
                     ip -o link show eth0 | grep -q LOWER_UP && kill -HUP -\$1" "$0" "$1" \
       </dev/null >/dev/null 2>&1 &' "$client" "$cmd"
trap 'on_network && kill -HUP "-$cmd" 2>/dev/null; exit 255' HUP INT TERM
while kill -0 "$cmd" 2>/dev/null; do sleep 0.05; done
code=$(cat "$dir/status" 2>/dev/null || echo 255)
rm -rf "$dir"
exit "$code"
